"""Is the in-container memory hook on this node? Checked, never assumed.

A memory slice gets its limit from HAMi's hook, ``libamvgpu.so``, which the kubelet mounts
from the pool's ``agent.hookPath`` on the host and ``LD_AUDIT`` loads (DESIGN.md section 4).
Nothing in rocshare ships that file, so the agent checks it: the DaemonSet mounts the host
folder at the same path, so the path the agent reads is the path the kubelet mounts.

`check_hook` is the one check (a stat and a read of the first bytes; cheap enough to run on
every Allocate of a slice and every inventory pass). The pure helpers turn its result into
the AmdGpuNode condition, the Node event of a transition and the monitor's gauge. Whole-GPU
containers never need the hook (container_spec.py gives them none).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.api.models import Condition, HookMissing
from rocshare_agent.deviceplugin.container_spec import HOOK_LIBRARY
from rocshare_agent.publish import Transition

CONDITION_TYPE = "MemoryHook"
REASON_FOUND = "MemoryHookFound"
REASON_MISSING = "MemoryHookMissing"
METRIC = "rocshare_node_memory_hook_present"


@dataclass(frozen=True)
class HookCheck:
    path: str  # the host path of the library, as the kubelet mounts it
    problem: str | None = None  # None: a non-empty regular file this agent could read

    @property
    def present(self) -> bool:
        return self.problem is None


def hook_library_path(hook_dir: str) -> str:
    return str(PurePosixPath(hook_dir) / HOOK_LIBRARY)


def check_hook(hook_dir: str) -> HookCheck:
    """Whether `<hook_dir>/libamvgpu.so` exists, is a non-empty regular file and can be read."""
    path = hook_library_path(hook_dir)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return HookCheck(path, "is not a regular file")
        if info.st_size == 0:
            return HookCheck(path, "is empty")
        with open(path, "rb") as library:
            library.read(4)
    except FileNotFoundError:
        return HookCheck(path, "is missing")
    except OSError as error:
        return HookCheck(path, f"cannot be read ({error.strerror})")
    return HookCheck(path)


# ---- pure: what the check means ---------------------------------------------------------------


def consequence(policy: HookMissing) -> str:
    if policy == HookMissing.REFUSE:
        return "memory slices on this node are refused (pool agent.hookMissing: Refuse)"
    return "memory slices on this node run without a memory limit (pool agent.hookMissing: RunWithoutLimit)"


def hook_condition(check: HookCheck, policy: HookMissing) -> Condition:
    if check.present:
        return Condition(type=CONDITION_TYPE, status="True", reason=REASON_FOUND,
                         message=f"{check.path} is readable: memory slices get their limit")
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
    """The monitor's gauge: 1 when the hook library is readable on this node, else 0."""

    def __init__(self, *, node_name: str, hook_dir: str, check: Callable[[str], HookCheck] = check_hook) -> None:
        self.node_name, self.hook_dir, self._check = node_name, hook_dir, check

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self._check(self.hook_dir)
        gauge = GaugeMetricFamily(METRIC, "1 when the memory hook library (libamvgpu.so) is readable on this node",
                                  labels=["node", "path"])
        gauge.add_metric([self.node_name, result.path], 1.0 if result.present else 0.0)
        yield gauge
