"""Shared helpers for the agent's unit tests: the real sysfs captures, read in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SYSFS_FIXTURES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "sysfs").resolve()


@pytest.fixture
def sysfs() -> Path:
    assert SYSFS_FIXTURES.is_dir(), f"missing {SYSFS_FIXTURES}: tests read ../shared in place"
    return SYSFS_FIXTURES


@pytest.fixture
def copy_capture(tmp_path: Path, sysfs: Path):
    """A writable copy of one capture in tmp_path, for synthetic variants (never in the project)."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(sysfs / name, target)
        for path in [target, *target.rglob("*")]:  # captures are read-only; the copy must not be
            path.chmod(0o755 if path.is_dir() else 0o644)
        return target

    return copy


# ---- real ELF files, compiled here (gcc), for the memory hook's check and install ------------

AUDIT_SOURCE = """
unsigned int la_version(unsigned int version) { return version; }
"""
VERSION_SOURCE = 'const char rocshare_hook_version[] = "rocshare-hook %s";\n'
PLAIN_SOURCE = "int plain_function(int x) { return x + 1; }\n"
MAIN_SOURCE = "int main(void) { return 0; }\n"


def compile_c(folder: Path, name: str, source: str, *flags: str) -> Path:
    """`source` compiled by gcc with `flags` into folder/name (a test that needs it fails without gcc)."""
    import subprocess

    src = folder / f"{name}.c"
    src.write_text(source)
    out = folder / name
    subprocess.run(["gcc", "-O1", *flags, "-o", str(out), str(src)], check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def elf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each kind of file a hook folder may hold, real ELF built by gcc: rocshare's hook (two
    versions), another audit library, a library without la_version, an executable, an object
    file, a 32-bit audit library, and text."""
    folder = tmp_path_factory.mktemp("elf")
    shared = ("-shared", "-fPIC")
    files = {
        "rocshare": compile_c(folder, "rocshare-1.so", AUDIT_SOURCE + VERSION_SOURCE % "1.2.3", *shared),
        "rocshare_next": compile_c(folder, "rocshare-2.so", AUDIT_SOURCE + VERSION_SOURCE % "1.3.0", *shared),
        "external": compile_c(folder, "external.so", AUDIT_SOURCE, *shared),
        "no_entry": compile_c(folder, "no-entry.so", PLAIN_SOURCE, *shared),
        "executable": compile_c(folder, "program", AUDIT_SOURCE + MAIN_SOURCE),
        "object": compile_c(folder, "object.o", AUDIT_SOURCE, "-c", "-fPIC"),
        # -nostdlib: this machine has the 32-bit compiler but no 32-bit C library; the audit
        # library needs none.
        "i386": compile_c(folder, "i386.so", AUDIT_SOURCE, *shared, "-m32", "-nostdlib"),
    }
    files["text"] = folder / "libamvgpu.txt"
    files["text"].write_bytes(b"rocshare test stand-in for libamvgpu.so\n")
    return files
