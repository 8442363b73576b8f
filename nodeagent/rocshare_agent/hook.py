"""Is the in-container memory hook on this node? Checked, never assumed.

A memory slice gets its limit from the hook, ``libamvgpu.so`` in the pool's ``agent.hookPath``
on the host, which the kubelet mounts into the container and ``LD_AUDIT`` loads (DESIGN.md
section 4). By default the agent installs rocshare's own hook there (hook_install.py); a pool
with ``agent.hookLibrary: External`` names a library the admin installs (HAMi's), which the
agent only checks. The DaemonSet mounts the host folder at the same path, so the path the agent
reads is the path the kubelet mounts.

`check_hook` is the one check: the file must be what the loader can use, an audit library for
this node (audit_library.py), not merely a readable file -- the loader skips anything else
silently, and the slice would run with no limit. The ELF is parsed once per file version (cached
by device, inode, size and mtime), so the check stays a stat on every Allocate of a slice and every
inventory pass. The pure helpers turn its result into the AmdGpuNode condition, the Node event of
a transition and the monitor's gauge. Whole-GPU containers never need the hook (container_spec.py
gives them none).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.api.models import Condition, HookMissing
from rocshare_agent.audit_library import NotAnAuditLibrary, inspect_audit_library, node_target
from rocshare_agent.deviceplugin.container_spec import HOOK_LIBRARY
from rocshare_agent.publish import Transition

CONDITION_TYPE = "MemoryHook"
REASON_FOUND = "MemoryHookFound"
REASON_MISSING = "MemoryHookMissing"
METRIC = "rocshare_node_memory_hook_present"


@dataclass(frozen=True)
class HookCheck:
    path: str  # the host path of the library, as the kubelet mounts it
    problem: str | None = None  # None: an audit library for this node
    library: str = ""  # when present: "rocshare-hook <version>" or "an external audit library"

    @property
    def present(self) -> bool:
        return self.problem is None


def hook_library_path(hook_dir: str) -> str:
    return str(PurePosixPath(hook_dir) / HOOK_LIBRARY)


def check_hook(hook_dir: str) -> HookCheck:
    """Whether `<hook_dir>/libamvgpu.so` (links followed, as the kubelet's mount follows them) is
    an audit library for this node; otherwise what is wrong with it."""
    path = hook_library_path(hook_dir)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return HookCheck(path, "is not a regular file")
        if info.st_size == 0:
            return HookCheck(path, "is empty")
        return HookCheck(path, library=_inspect(path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
    except FileNotFoundError:
        return HookCheck(path, "is missing")
    except NotAnAuditLibrary as wrong:
        return HookCheck(path, str(wrong))
    except OSError as error:
        return HookCheck(path, f"cannot be read ({error.strerror})")


@lru_cache(maxsize=16)
def _inspect(path: str, _device: int, _inode: int, _size: int, _mtime_ns: int) -> str:
    """The library's description; the stat fields are the cache key, so a replaced file is read again."""
    arch, target = node_target()
    with open(path, "rb") as stream:
        return inspect_audit_library(stream, arch=arch, target=target).description


# ---- pure: what the check means ---------------------------------------------------------------


def consequence(policy: HookMissing) -> str:
    if policy == HookMissing.REFUSE:
        return "memory slices on this node are refused (pool agent.hookMissing: Refuse)"
    return "memory slices on this node run without a memory limit (pool agent.hookMissing: RunWithoutLimit)"


def hook_condition(check: HookCheck, policy: HookMissing) -> Condition:
    if check.present:
        return Condition(type=CONDITION_TYPE, status="True", reason=REASON_FOUND,
                         message=f"{check.path} is {check.library}, an audit library for this node: "
                                 "memory slices get their limit")
    return Condition(type=CONDITION_TYPE, status="False", reason=REASON_MISSING,
                     message=f"{check.path} {check.problem}: {consequence(policy)}")


def hook_transition(before: HookCheck | None, now: HookCheck, policy: HookMissing) -> Transition | None:
    """The Node event when the hook goes or comes back; a missing hook is reported on the first
    check too (an agent that starts on a node without it says so once)."""
    if not now.present and (before is None or before.present):
        return Transition(REASON_MISSING, "", hook_condition(now, policy).message, event_type="Warning")
    if now.present and before is not None and not before.present:
        return Transition(REASON_FOUND, "", hook_condition(now, policy).message, event_type="Normal")
    return None


def missing_message(check: HookCheck, *, node: str) -> str:
    """The refusal the kubelet shows on a slice pod (Allocate's error names the file)."""
    return (f"the memory hook {check.path} {check.problem} on node {node}, so this slice cannot get its memory "
            f"limit; install the hook there or set the pool's agent.hookMissing to RunWithoutLimit")


def unlimited_message(check: HookCheck, *, container: str) -> str:
    """The Warning event on a slice pod that runs without the hook."""
    return (f"container {container} has no memory limit: the memory hook {check.path} {check.problem} "
            f"on this node (pool agent.hookMissing: RunWithoutLimit)")


class HookCollector(Collector):
    """The monitor's gauge: 1 when the hook is an audit library for this node, else 0; the
    `library` label names it (empty when it is not there)."""

    def __init__(self, *, node_name: str, hook_dir: str, check: Callable[[str], HookCheck] = check_hook) -> None:
        self.node_name, self.hook_dir, self._check = node_name, hook_dir, check

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self._check(self.hook_dir)
        gauge = GaugeMetricFamily(METRIC, "1 when the memory hook (libamvgpu.so) is an audit library for this node",
                                  labels=["node", "path", "library"])
        gauge.add_metric([self.node_name, result.path, result.library], 1.0 if result.present else 0.0)
        yield gauge
