"""The hook library as a file: its C tests (plain, ASan, UBSan) and what it exports. The glibc it needs is
checked on the library in the built image (test_hook_in_image.py), and by hook/Makefile on every build."""

from __future__ import annotations

import re
import subprocess

from tests.hook.conftest import HOOK_DIR, HookBuild


def _dynamic_symbols(library) -> str:
    return subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True).stdout


def test_c_suite_plain_asan_ubsan():
    """hook-test and race-test in the plain, ASan and UBSan builds; race-test and hook-test's CU-mask race
    under TSan too."""
    out = subprocess.run(["make", "-C", str(HOOK_DIR), "-s", "test"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    ran = re.findall(r"^== (\S+)$", out.stdout, re.M)
    assert ran == [f"build/{b}/{p}" for b in ("plain", "asan", "ubsan") for p in ("hook-test", "race-test")] + [
        "build/tsan/race-test", "build/tsan/hook-test"]
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



def test_the_hook_sources_call_no_libc_number_parser():
    """glibc >= 2.38 headers turn strtol/strtoull/sscanf (and atoi's inline strtol) into
    __isoc23_* (GLIBC_2.38): a build on such a system would pass here on an older glibc and fail
    only in the image's trixie stage. The hook parses with hook/src/parse.c instead. Only the
    library's sources (hook/Makefile's HOOK_SRC): the load check is a static program of its own."""
    pattern = re.compile(r"\b(strto(?:u?ll?|u?imax|[dfl]|ld)|v?f?sscanf|v?f?scanf|ato[il]l?)\s*\(")
    library = re.search(r"^HOOK_SRC := (.*)$", (HOOK_DIR / "Makefile").read_text(), re.M).group(1).split()
    sources = [HOOK_DIR / name for name in library] + sorted((HOOK_DIR / "src").glob("*.h"))
    calls = [f"{path.name}: {match.group(1)}" for path in sources
             for match in pattern.finditer(re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S))]
    assert not calls, calls
