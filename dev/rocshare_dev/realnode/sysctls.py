"""The kernel settings the kubelet rewrites at start (real-node.md, trap 2).

Unless `protectKernelDefaults` is on (which makes the kubelet refuse to start here), it sets
kernel.panic_on_oops=1, vm.overcommit_memory=1 and kernel.panic=10. These are machine-wide,
not per namespace, and other work shares the machine: record them before, restore them after.
"""

from __future__ import annotations

from pathlib import Path

KUBELET_REWRITES = ("kernel.panic_on_oops", "vm.overcommit_memory", "kernel.panic")


def _path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def record(names: tuple[str, ...] = KUBELET_REWRITES) -> dict[str, str]:
    return {name: _path(name).read_text().strip() for name in names}


def restore(values: dict[str, str]) -> list[str]:
    """Write back every value that differs; returns the names that had been changed."""
    changed = [name for name, value in values.items() if _path(name).read_text().strip() != value]
    for name in changed:
        _path(name).write_text(values[name])
    return changed
