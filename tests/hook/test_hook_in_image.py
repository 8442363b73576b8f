"""The hook that ships: the library taken OUT OF the built node-agent image (`make images`,
.cache/images/node-agent.tar), never a host build. Its glibc symbol versions stay at or below the
floor stated in hook/GLIBC_FLOOR, it needs nothing but libc, and the glibc of this machine (2.36,
below the 2.38 the image's trixie build stage has) loads it as an audit library and it limits a
slice. The readelf output is read here, independently of hook/check-glibc-floor.sh.

ROCSHARE_AGENT_ARCHIVE names another docker-archive (e.g. an older build) to check instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from tests.hook.conftest import HOOK_DIR, MIB, HookBuild

ARCHIVE = Path(os.environ.get("ROCSHARE_AGENT_ARCHIVE", HOOK_DIR.parent / ".cache" / "images" / "node-agent.tar"))
LIBRARY = PurePosixPath("opt/rocshare/hook/librocshare-hook.so")
LIMIT_MIB = 64


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def library_from_image(archive: Path, member: PurePosixPath, into: Path) -> Path:
    """The file at `member` in the image's final filesystem: the last layer that has it (or
    deletes it with an overlay whiteout) wins, as the runtime's overlay would decide."""
    found: bytes | None = None
    with tarfile.open(archive) as image:
        (manifest,) = json.load(image.extractfile("manifest.json"))
        for layer_name in manifest["Layers"]:
            with tarfile.open(fileobj=image.extractfile(layer_name)) as layer:
                for entry in layer:
                    path = PurePosixPath(entry.name.removeprefix("./"))
                    if path == member and entry.isfile():
                        found = layer.extractfile(entry).read()
                    elif path == member.parent / f".wh.{member.name}":
                        found = None
    assert found is not None, f"{member} is not in {archive}"
    into.write_bytes(found)
    return into


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    assert ARCHIVE.exists(), f"{ARCHIVE} missing: run `make images` first"
    return library_from_image(ARCHIVE, LIBRARY, tmp_path_factory.mktemp("image") / "librocshare-hook.so")


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def test_the_shipped_hook_needs_no_glibc_above_the_floor(shipped: Path):
    floor = _version((HOOK_DIR / "GLIBC_FLOOR").read_text().strip())
    needs = set(re.findall(r"Name: GLIBC_([0-9.]+)\s", _readelf("-V", str(shipped))))
    assert needs, "readelf -V lists no GLIBC version need: its output changed?"
    above = sorted(f"GLIBC_{v}" for v in needs if _version(v) > floor)
    imports = [line.split()[7] for line in _readelf("--dyn-syms", str(shipped)).splitlines()
               if len(line.split()) >= 8 and line.split()[6] == "UND"]
    assert not above, f"the image's hook needs {above} (floor {floor}); imports {imports}"
    assert not [name for name in imports if re.match(r"__isoc23_|__stack_chk_|__\w+_chk@", name)], imports


def test_the_shipped_hook_needs_only_libc(shipped: Path):
    assert re.findall(r"\(NEEDED\).*\[(.*)\]", _readelf("-d", str(shipped))) == ["libc.so.6"]


def test_this_machines_older_glibc_loads_the_shipped_hook_and_it_limits(shipped: Path, hook_build: HookBuild,
                                                                        tmp_path):
    """The image's library under LD_AUDIT in a process of this machine (glibc 2.36 < trixie's
    2.41): hook-probe built here sees the slice and one MiB past it is refused."""
    env = hook_build.env(tmp_path, HIP_DEVICE_MEMORY_LIMIT_0=f"{LIMIT_MIB}m")
    env["LD_AUDIT"] = str(shipped)
    done = subprocess.run([str(hook_build.probe), "alloc", str((LIMIT_MIB + 1) * MIB)], env=env, input="",
                          capture_output=True, text=True, timeout=60, check=True)
    assert "cannot be loaded as audit interface" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["result"] == "hipErrorOutOfMemory", (done.stdout, done.stderr)
    info = hook_build.probe_json(env, "info")["memGetInfo"]
    assert info["total"] == LIMIT_MIB * MIB, info
