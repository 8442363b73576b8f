"""Installs rocshare's memory hook, shipped in the agent image, into the pool's hookPath.

Runs once when the agent starts, before it offers slices (app.py), unless the pool's
``agent.hookLibrary`` is External (the admin's library is then only checked, hook.py).
Invariants:

* The library is written once per content as ``<hookPath>/rocshare-hook-<version>-<sha>.so``
  (a temporary file in the same folder, fsync, rename): a file of that name never changes, so
  a process that mapped it keeps exactly what it mapped.
* ``<hookPath>/libamvgpu.so`` becomes a relative symlink to it, swapped by renaming a new link
  over the old one: the kubelet mounts the old library or the new one, never a half-written
  file or no file. Running containers keep theirs (their bind mount holds the inode).
* The newest `KEEP_VERSIONS` versioned files stay; older ones go, but never the link's target.
* The source is checked like the installed file (an audit library for this node) before any
  write, so a broken image never replaces a working hook.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rocshare_agent.audit_library import VERSION_PREFIX, inspect_audit_library, node_target
from rocshare_agent.deviceplugin.container_spec import HOOK_LIBRARY

log = logging.getLogger(__name__)

SHIPPED_HOOK = Path("/opt/rocshare/hook/librocshare-hook.so")
"""Where the agent image holds the hook it installs (images/agent.Dockerfile)."""
KEEP_VERSIONS = 3
SHA_DIGITS = 12
VERSIONED = re.compile(r"^rocshare-hook-[0-9A-Za-z.+_-]+-[0-9a-f]{%d}\.so$" % SHA_DIGITS)
_TEMP_PREFIX = ".rocshare-install-"


class InstallError(RuntimeError):
    """The shipped library cannot be installed (not an audit library, no version)."""


@dataclass(frozen=True)
class Installed:
    link: Path  # <hookPath>/libamvgpu.so
    target: str  # the versioned file's name, relative to the link
    version: str  # "rocshare-hook <version>"
    changed: bool  # False: the link already named this file


# ---- pure ---------------------------------------------------------------------------------


def versioned_name(version: str, content: bytes) -> str:
    """`rocshare-hook-<version>-<first 12 hex of sha256>.so` for "rocshare-hook <version>"."""
    number = version.removeprefix(VERSION_PREFIX).strip()
    if not number or not re.fullmatch(r"[0-9A-Za-z.+_-]+", number):
        raise InstallError(f"unusable hook version {version!r}")
    return f"rocshare-hook-{number}-{hashlib.sha256(content).hexdigest()[:SHA_DIGITS]}.so"


def names_to_remove(by_age_newest_first: list[str], *, current: str, keep: int = KEEP_VERSIONS) -> list[str]:
    """The versioned files past the newest `keep`, never `current`."""
    return [name for name in by_age_newest_first[keep:] if name != current]


# ---- on disk ------------------------------------------------------------------------------


def install_hook(source: Path, hook_dir: Path) -> Installed:
    content = source.read_bytes()
    version = _shipped_version(source)
    name = versioned_name(version, content)
    hook_dir.mkdir(parents=True, exist_ok=True)
    _remove_leftover_temporaries(hook_dir)
    if not (hook_dir / name).is_file():
        _write_atomically(hook_dir, name, content)
    link = hook_dir / HOOK_LIBRARY
    changed = not (link.is_symlink() and os.readlink(link) == name)
    if changed:
        _point_link(hook_dir, name)
    _prune(hook_dir, current=name)
    return Installed(link=link, target=name, version=version, changed=changed)


def _shipped_version(source: Path) -> str:
    arch, target = node_target()
    with source.open("rb") as stream:
        version = inspect_audit_library(stream, arch=arch, target=target).version
    if version is None:
        raise InstallError(f"{source} carries no {VERSION_PREFIX.strip()} version: not rocshare's hook")
    return version


def _write_atomically(folder: Path, name: str, content: bytes) -> None:
    temporary = folder / f"{_TEMP_PREFIX}{os.getpid()}.so"
    with temporary.open("wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    temporary.chmod(0o644)  # read by every container user; written by no one
    temporary.rename(folder / name)
    _sync_folder(folder)


def _point_link(folder: Path, name: str) -> None:
    temporary = folder / f"{_TEMP_PREFIX}{os.getpid()}.link"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(name)
    temporary.rename(folder / HOOK_LIBRARY)  # rename(2) replaces the old link or file atomically
    _sync_folder(folder)


def _remove_leftover_temporaries(folder: Path) -> None:
    """An agent killed mid-install leaves its temporary file; only one agent runs per node."""
    for leftover in folder.glob(f"{_TEMP_PREFIX}*"):
        leftover.unlink(missing_ok=True)


def _prune(folder: Path, *, current: str) -> None:
    versions = [p for p in folder.iterdir() if VERSIONED.match(p.name) and not p.is_symlink()]
    versions.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for name in names_to_remove([p.name for p in versions], current=current):
        (folder / name).unlink(missing_ok=True)
        log.info("memory hook: removed the old version %s", name)


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
