"""The memory hook proved, not assumed (audit_library.py, hook.py's check, hook_install.py), on
real ELF files gcc builds in the test (conftest.elf_files): only a shared library for this
node's architecture that exports la_version passes, rocshare's is named by its version
symbol, anything else is reported missing with the reason; the agent installs the shipped
hook as a versioned file behind an atomically swapped libamvgpu.so link."""

from __future__ import annotations

import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from rocshare.api.models import HookMissing
from rocshare_agent.audit_library import EXTERNAL, NotAnAuditLibrary, inspect_audit_library, node_target
from rocshare_agent.hook import HookCheck, HookCollector, check_hook, hook_condition
from rocshare_agent.hook_install import (KEEP_VERSIONS, InstallError, install_hook, names_to_remove,
                                         versioned_name)
from tests.unit.agent.conftest import AUDIT_SOURCE, compile_c

pytestmark = pytest.mark.skipif(node_target()[0] != "x86_64", reason="the 32-bit case is built for x86_64 hosts")


def place(hook_dir: Path, source: Path) -> Path:
    hook_dir.mkdir(parents=True, exist_ok=True)
    library = hook_dir / "libamvgpu.so"
    shutil.copyfile(source, library)
    return library


def other_architecture(source: Path, folder: Path) -> Path:
    """A copy of a real x86-64 library whose header says AArch64 (e_machine 183, offset 18)."""
    data = bytearray(source.read_bytes())
    data[18:20] = struct.pack("<H", 183)
    out = folder / "aarch64.so"
    out.write_bytes(bytes(data))
    return out


# ---- what the check accepts ----------------------------------------------------------------------


def test_rocshare_hook_is_named_by_its_version_symbol(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    library = place(tmp_path, elf_files["rocshare"])
    assert check_hook(str(tmp_path)) == HookCheck(str(library), None, "rocshare-hook 1.2.3")
    condition = hook_condition(check_hook(str(tmp_path)), HookMissing.REFUSE)
    assert (condition.status, condition.reason) == ("True", "MemoryHookFound")
    assert condition.message == (f"{library} is rocshare-hook 1.2.3, an audit library for this node: "
                                 "memory slices get their limit")


def test_another_audit_library_is_external(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    place(tmp_path, elf_files["external"])
    check = check_hook(str(tmp_path))
    assert check.present and check.library == EXTERNAL == "an external audit library"


@pytest.mark.parametrize(("kind", "problem"), [
    ("text", "is not a readable ELF file"),
    ("no_entry", "does not export the audit entry point la_version (not an LD_AUDIT library)"),
    ("executable", "is an executable, not a shared library"),
    ("object", "is not a shared library (ELF type ET_REL)"),
    ("i386", "is built for EM_386 (32-bit, little-endian), not this node's x86_64"),
])
def test_anything_but_an_audit_library_is_missing_with_the_reason(tmp_path: Path, elf_files: dict[str, Path],
                                                                  kind: str, problem: str) -> None:
    library = place(tmp_path / "hook", elf_files[kind])
    check = check_hook(str(tmp_path / "hook"))
    assert not check.present and check.problem.startswith(problem), check
    condition = hook_condition(check, HookMissing.REFUSE)
    assert (condition.status, condition.reason) == ("False", "MemoryHookMissing")
    assert condition.message.startswith(f"{library} {problem}")


def test_a_library_for_another_architecture_is_missing(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    place(tmp_path, other_architecture(elf_files["external"], tmp_path))
    assert check_hook(str(tmp_path)).problem == \
        "is built for EM_AARCH64 (64-bit, little-endian), not this node's x86_64"
    arch, target = node_target("aarch64")
    with (tmp_path / "libamvgpu.so").open("rb") as stream:  # the same file passes on an arm64 node
        assert inspect_audit_library(stream, arch=arch, target=target).version is None


def test_an_undefined_or_hidden_la_version_does_not_count(tmp_path: Path) -> None:
    imports = compile_c(tmp_path, "imports.so", "extern unsigned int la_version(unsigned int);\n"
                        "unsigned int call(void) { return la_version(1); }\n", "-shared", "-fPIC")
    hidden = compile_c(tmp_path, "hidden.so", "__attribute__((visibility(\"hidden\")))" + AUDIT_SOURCE,
                       "-shared", "-fPIC")
    arch, target = node_target()
    for library in (imports, hidden):
        with library.open("rb") as stream, pytest.raises(NotAnAuditLibrary, match="does not export"):
            inspect_audit_library(stream, arch=arch, target=target)


def test_a_replaced_file_is_read_again(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    place(tmp_path, elf_files["rocshare"])
    assert check_hook(str(tmp_path)).library == "rocshare-hook 1.2.3"
    place(tmp_path, elf_files["text"])
    assert not check_hook(str(tmp_path)).present


def test_monitor_gauge_names_the_library(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    collector = HookCollector(node_name="n", hook_dir=str(tmp_path))
    place(tmp_path, elf_files["no_entry"])
    assert next(iter(collector.collect())).samples[0].value == 0
    place(tmp_path, elf_files["rocshare"])
    (sample,) = next(iter(collector.collect())).samples
    assert sample.value == 1 and sample.labels["library"] == "rocshare-hook 1.2.3"


# ---- the install -----------------------------------------------------------------------------------


def test_versioned_names() -> None:
    assert versioned_name("rocshare-hook 1.2.3", b"x") == "rocshare-hook-1.2.3-2d711642b726.so"  # sha256("x")
    with pytest.raises(InstallError):
        versioned_name("rocshare-hook ../../etc", b"x")
    assert names_to_remove(["d", "c", "b", "a"], current="a", keep=2) == ["b"]
    assert names_to_remove(["a", "b"], current="a", keep=1) == ["b"]


def test_install_into_an_empty_folder(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    hook_dir = tmp_path / "vgpu"  # not there yet: the agent makes it
    installed = install_hook(elf_files["rocshare"], hook_dir)
    link = hook_dir / "libamvgpu.so"
    assert installed.changed and installed.version == "rocshare-hook 1.2.3"
    assert link.is_symlink() and os.readlink(link) == installed.target  # relative: resolves on the host
    assert (hook_dir / installed.target).read_bytes() == elf_files["rocshare"].read_bytes()
    assert oct((hook_dir / installed.target).stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in hook_dir.iterdir()) == sorted(["libamvgpu.so", installed.target])
    assert check_hook(str(hook_dir)).library == "rocshare-hook 1.2.3"
    again = install_hook(elf_files["rocshare"], hook_dir)
    assert not again.changed and again.target == installed.target


def test_upgrade_keeps_the_file_a_running_process_mapped(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    old = install_hook(elf_files["rocshare"], tmp_path)
    with (tmp_path / "libamvgpu.so").open("rb") as mapped:  # a container's process holds the old one
        new = install_hook(elf_files["rocshare_next"], tmp_path)
        assert new.changed and new.target != old.target
        assert mapped.read() == elf_files["rocshare"].read_bytes()
    assert (tmp_path / old.target).read_bytes() == elf_files["rocshare"].read_bytes()  # kept a while
    assert check_hook(str(tmp_path)).library == "rocshare-hook 1.3.0"


def test_an_admins_file_is_replaced_by_the_link(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    place(tmp_path, elf_files["external"])
    install_hook(elf_files["rocshare"], tmp_path)
    assert check_hook(str(tmp_path)).library == "rocshare-hook 1.2.3"


def test_old_versions_are_pruned_but_never_the_one_in_use(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    folder = tmp_path / "builds"
    folder.mkdir()
    targets = []
    for n in range(KEEP_VERSIONS + 2):
        version = f'const char rocshare_hook_version[] = "rocshare-hook 0.{n}";'
        source = compile_c(folder, f"v{n}.so", AUDIT_SOURCE + version, "-shared", "-fPIC")
        targets.append(install_hook(source, tmp_path / "vgpu").target)
        os.utime(tmp_path / "vgpu" / targets[-1], ns=(n * 10**9, n * 10**9))  # distinct ages
    kept = sorted(p.name for p in (tmp_path / "vgpu").iterdir() if p.name != "libamvgpu.so")
    assert kept == sorted(targets[-KEEP_VERSIONS:])
    # Back to the oldest kept one (a rollback): it is current now, whatever its age.
    source = folder / f"v{len(targets) - KEEP_VERSIONS}.so"
    assert install_hook(source, tmp_path / "vgpu").target == targets[-KEEP_VERSIONS]
    assert os.readlink(tmp_path / "vgpu" / "libamvgpu.so") == targets[-KEEP_VERSIONS]


@pytest.mark.parametrize("kind", ["external", "text", "i386"])
def test_a_shipped_file_that_is_not_rocshares_hook_is_never_installed(tmp_path: Path, elf_files: dict[str, Path],
                                                                     kind: str) -> None:
    working = install_hook(elf_files["rocshare"], tmp_path)
    with pytest.raises((InstallError, NotAnAuditLibrary)):
        install_hook(elf_files[kind], tmp_path)
    assert os.readlink(tmp_path / "libamvgpu.so") == working.target
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["libamvgpu.so", working.target])


def test_the_link_is_always_a_whole_library_while_it_is_swapped(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    """What the kubelet would mount at any moment of repeated upgrades: never absent, never partial."""
    install_hook(elf_files["rocshare"], tmp_path)
    sizes = {elf_files[k].stat().st_size for k in ("rocshare", "rocshare_next")}
    seen: list[tuple[str, int]] = []  # (what the check said, the size the link resolved to)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                size = os.stat(tmp_path / "libamvgpu.so").st_size
            except FileNotFoundError:
                size = -1
            check = check_hook(str(tmp_path))
            seen.append((check.library if check.present else f"problem: {check.problem}", size))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n in range(40):
            install_hook(elf_files["rocshare_next" if n % 2 == 0 else "rocshare"], tmp_path)
    finally:
        stop.set()
        watcher.join()
    assert seen and {said for said, _ in seen} <= {"rocshare-hook 1.2.3", "rocshare-hook 1.3.0"}, set(seen)
    assert {size for _, size in seen} <= sizes, set(seen)


# ---- the agent's start-up step -----------------------------------------------------------------------


def test_the_agent_installs_only_for_a_rocshare_pool_and_survives_a_failure(tmp_path: Path, elf_files: dict[str, Path],
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    from rocshare.api.models import HookLibrary
    from rocshare_agent.app import AgentConfig, _install_hook

    external = AgentConfig(node_name="n", hook_path=str(tmp_path / "ext"), hook_library=HookLibrary.EXTERNAL,
                           hook_source=elf_files["rocshare"])
    _install_hook(external)
    assert not (tmp_path / "ext").exists()  # the admin's folder is never written
    _install_hook(AgentConfig(node_name="n", hook_path=str(tmp_path / "vgpu"), hook_source=elf_files["rocshare"]))
    assert check_hook(str(tmp_path / "vgpu")).library == "rocshare-hook 1.2.3"
    _install_hook(AgentConfig(node_name="n", hook_path=str(tmp_path / "bad"), hook_source=tmp_path / "absent.so"))
    assert "cannot install" in caplog.text and not check_hook(str(tmp_path / "bad")).present
