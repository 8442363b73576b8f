"""The hook library as a file: its C tests (plain, ASan, UBSan), what it exports, the glibc it needs."""

from __future__ import annotations

import re
import subprocess

from tests.hook.conftest import HOOK_DIR, HookBuild

# The highest glibc symbol version the hook may need. Users' images vary; HAMi's library needs
# GLIBC_2.34 and is silently ignored by older loaders. 2.17 is RHEL/CentOS 7's glibc.
GLIBC_FLOOR = (2, 17)


def _dynamic_symbols(library) -> str:
    return subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True).stdout


def test_c_suite_plain_asan_ubsan():
    """hook-test and race-test in the plain, ASan and UBSan builds, race-test under TSan too."""
    out = subprocess.run(["make", "-C", str(HOOK_DIR), "-s", "test"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    ran = re.findall(r"^== (\S+)$", out.stdout, re.M)
    assert ran == [f"build/{b}/{p}" for b in ("plain", "asan", "ubsan") for p in ("hook-test", "race-test")] + [
        "build/tsan/race-test"]
    assert [line for line in out.stdout.splitlines() if line.startswith("ok:")] == ["ok: 0 failures"] * len(ran)


def test_exports_only_the_audit_interface_and_version(hook_build: HookBuild):
    defined = set()
    for line in _dynamic_symbols(hook_build.library).splitlines():
        fields = line.split()
        if len(fields) >= 7 and fields[1] == "g" and "*UND*" not in line:
            defined.add(fields[-1])
    assert defined == {"la_version", "la_objopen", "la_symbind64", "rocshare_hook_version"}


def test_version_symbol_names_hook_version(hook_build: HookBuild):
    version = (HOOK_DIR / "VERSION").read_text().strip()
    data = hook_build.library.read_bytes()
    assert f"rocshare-hook {version}\0".encode() in data


def test_glibc_requirement_stays_low(hook_build: HookBuild):
    needed = {
        tuple(int(p) for p in m.split("."))
        for m in re.findall(r"GLIBC_([0-9.]+)\)?\s", _dynamic_symbols(hook_build.library))
    }
    assert needed, "no glibc symbol versions found: objdump output changed?"
    assert max(needed) <= GLIBC_FLOOR, f"the hook needs GLIBC_{'.'.join(map(str, max(needed)))}"
