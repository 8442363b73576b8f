"""A thin, forgiving reader for sysfs-like trees (the only file I/O of discovery).

Invariants: nothing here raises on a file's *content* or on a missing file. Text comes
back with NUL padding and surrounding whitespace removed (amdgpu pads some attributes
with NULs, and LACT captures showed trailing newlines), or None when the file is
missing or unreadable. Parsing the text is someone else's job (kfd.py, drm.py).
"""

from __future__ import annotations

import os
from pathlib import Path

# sysfs attributes are at most a page; anything bigger is not an attribute we want.
_MAX_ATTRIBUTE_BYTES = 64 * 1024


def read_text(path: Path | str) -> str | None:
    """The file's text without NULs and surrounding whitespace; None when it cannot be read."""
    # os.open/os.read, not open(): a buffered file object costs more than the read itself,
    # and discovery reads thousands of small files on partitioned GPUs.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(descriptor, _MAX_ATTRIBUTE_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return data.replace(b"\0", b"").decode("utf-8", errors="replace").strip()


def list_names(path: Path) -> list[str]:
    """Entry names of a folder, sorted; empty when it is missing or not a folder."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def numbered_children(path: Path, prefix: str = "") -> list[tuple[int, Path]]:
    """Children named `<prefix><number>`, in numeric order (sysfs lists 10 before 2)."""
    found = []
    for name in list_names(path):
        suffix = name[len(prefix):] if name.startswith(prefix) else None
        if suffix and suffix.isdigit():
            found.append((int(suffix), path / name))
    return sorted(found)


def resolved_name(path: Path) -> str | None:
    """Basename of where a symlink leads (sysfs `device` links end in the PCI address)."""
    try:
        return Path(os.path.realpath(path)).name if path.exists() else None
    except OSError:
        return None
