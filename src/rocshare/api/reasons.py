"""Every reason rocshare writes where a user reads it, in one place.

A reason is the one CamelCase word of a scheduler filter failure (``"2/8 CardInsufficientMemory"``
in the pod's FailedScheduling event), of an Event on a Pod, Node or AmdGpuPool, or of a condition
on an AmdGpuNode, AmdGpuPool or AmdGpuShare. The code that emits each one keeps its own constant
(the fit reasons are `rocshare.core.fit.Reason`); this catalogue names them all with where they
appear, so docs/troubleshooting.md can take each to what it means and what to do.

Invariant (tests/unit/test_reasons.py): the catalogue holds exactly the reasons the product's code
can emit, found by reading that code, and docs/troubleshooting.md has an entry for each. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Where(StrEnum):
    """Where a user meets a reason."""

    FILTER = "scheduler filter (FailedScheduling event on the pod)"
    POD_EVENT = "Event on the pod"
    NODE_EVENT = "Event on the Node"
    POOL_EVENT = "Event on the AmdGpuPool"
    NODE_CONDITION = "AmdGpuNode condition"
    POOL_CONDITION = "AmdGpuPool condition"
    SHARE_CONDITION = "AmdGpuShare condition"
    DRA_PREPARE = "DRA prepare error (the kubelet's FailedPrepareDynamicResources event on the pod)"
    POD_CONDITION = "Pod condition (kubectl describe pod)"
    ADMISSION = "admission error (the pod's create is refused, e.g. by kubectl apply)"


@dataclass(frozen=True)
class EmittedReason:
    name: str
    where: tuple[Where, ...]
    healthy: bool = False
    """True for the reasons of a good state (a condition that is as it should be): listed, not a problem."""


def _reasons(where: Where, *names: str, healthy: bool = False) -> tuple[EmittedReason, ...]:
    return tuple(EmittedReason(name, (where,), healthy) for name in names)


FILTER_REASONS = _reasons(
    Where.FILTER,
    "CardNotHealth", "CardTypeMismatch", "NumaNotFit", "LinkNotFit", "CardUuidMismatch",
    "CardTimeSlicingExhausted", "ExclusiveDeviceAllocateConflict", "ResourceQuotaNotFit",
    "CardInsufficientMemory", "CardInsufficientCore", "NodeInsufficientCPU", "NodeInsufficientMemory",
    "NodeInsufficientGPUs", "NoGpuInventory", "UndecodableAllocationRecord", "NodeUnreadable",
)
"""The per-node reasons of the extender's filter: rocshare.core.fit.Reason plus the whole-node
ones of the operator's extender (no inventory, a blocked node, a node whose facts cannot be read)."""

EVENT_REASONS = (
    *_reasons(Where.POD_EVENT, "NoMemoryLimit", "UnaccountableAllocation", "LoadCheckNotRun"),
    # Preemption (rocshare_operator.extender.preemptor): on the victims, on the preemptor.
    *_reasons(Where.POD_EVENT, "Preempted", "PreemptedSlices", "PreemptionNotHelpful", "PreemptionOverQuota"),
    *_reasons(Where.POD_CONDITION, "PreemptionByScheduler"),
    *_reasons(Where.NODE_EVENT, "AMDGPUUnhealthy", "AMDGPUMissing", "DrainRequired"),
    *_reasons(Where.NODE_EVENT, "AMDGPURecovered", healthy=True),
    *_reasons(Where.POOL_EVENT, "NodeConflict"),
)

CONDITION_REASONS = (
    # AmdGpuNode: Ready, DevicePlugin, MemoryHook and PoolSettings, written by the node's agent.
    *_reasons(Where.NODE_CONDITION, "NoGpus", "NotWatched", "AgentStopping", "Unreadable"),
    *_reasons(Where.NODE_CONDITION, "GpusFound", "Serving", "MemoryHookFound", "Read", healthy=True),
    # AmdGpuPool: Ready and Degraded, written by the operator.
    *_reasons(Where.POOL_CONDITION, "InvalidPool", "NoNodes", "NoGpusReported", "UnhealthyGpus",
              "NodesNotReporting", "UndecodableAllocations", "EventsNotHandled", "NodeConflicts"),
    *_reasons(Where.POOL_CONDITION, "GpusAvailable", "AsExpected", healthy=True),
    # AmdGpuShare: Ready.
    *_reasons(Where.SHARE_CONDITION, "UnaccountablePods"),
    *_reasons(Where.SHARE_CONDITION, "QuotaApplied", healthy=True),
)

PREPARE_REASONS = _reasons(
    Where.DRA_PREPARE,
    "ShareNotHonoured", "DeviceNotOnNode", "AllocationUnreadable", "ClaimNotAllocated", "PreparedRecordUnreadable",
    "ClaimSharedByConsumers", "AccountFolderUnusable",
)
"""Why the node agent refused to prepare a DRA claim (pools with agent.interface DRA): the first
word of the error the kubelet reports (rocshare.core.dra_shares, rocshare_agent.dra.plugin)."""

ADMISSION_REASONS = _reasons(Where.ADMISSION, "MixedPoolInterfaces", "DraRequestUnsatisfiable", "ProtectedEnvVar",
                             "ProtectedEnvFrom", "HookPathMount", "HostDeviceVolume", "PrivilegedSlice")
"""Why the webhook refused a pod with amd.com/* limits that would go to a DRA pool
(rocshare_operator.admission.dra_pods): the first word of the refusal."""

RESIZE_REASONS = tuple(
    EmittedReason(name, (Where.POD_CONDITION, Where.POD_EVENT), healthy=name == "Resized")
    for name in ("Resized", "ResizeInsufficientMemory", "ResizeInsufficientCores", "ResizeQuotaExceeded",
                 "ResizeInvalidRequest", "ResizeWholeDevice", "ResizeDraClaim")
)
"""The operator's answer to a resize request (rocshare.core.resize): the reason of the pod's
rocshare.io/Resized condition and of the Event beside it."""

SHARED_REASONS = (
    # One word, several places: the same state reported by the agent and summed by the operator.
    EmittedReason("NoHealthyGpus", (Where.NODE_CONDITION, Where.POOL_CONDITION)),
    EmittedReason("MemoryHookMissing", (Where.NODE_CONDITION, Where.NODE_EVENT)),
)


def _merged(*groups: tuple[EmittedReason, ...]) -> dict[str, EmittedReason]:
    """name -> reason; a name in two groups (DrainRequired: a Node event and a pool condition) keeps
    every place it appears."""
    merged: dict[str, EmittedReason] = {}
    for group in groups:
        for reason in group:
            known = merged.get(reason.name)
            where = reason.where if known is None else known.where + reason.where
            merged[reason.name] = EmittedReason(reason.name, where, reason.healthy)
    return merged


ALL: dict[str, EmittedReason] = _merged(
    FILTER_REASONS, EVENT_REASONS, CONDITION_REASONS, PREPARE_REASONS, ADMISSION_REASONS, RESIZE_REASONS,
    SHARED_REASONS,
    _reasons(Where.POOL_CONDITION, "DrainRequired"),
)
"""Every reason rocshare emits, by name."""
