"""Does a container's request fit a GPU, and if not, why (the reasons of DESIGN.md section 3).

Works on plain ints: a GPU's load is ``(memory_mib, slices, cu_held, whole)`` and a need is a
small frozen record computed once per (GPU spec, container). Each GPU gets the *first*
failing reason in a fixed order (health, type, uuid, exclusivity, slices, memory, cores), so
the per-node summary ``"<n>/<total> <Reason>"`` counts every GPU exactly once.

``NodeSummary`` is the O(1) pre-check: a few maxima over the node's GPUs that reject most
nodes that cannot fit before any per-GPU work. It is conservative: it never rejects a node
on which the exact check would succeed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rocshare.api.models import OmittedCores
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.request import ContainerRequest, PodRequest, Selection
from rocshare.core.share_rules import cus_for_percent, memory_need_mib, omitted_cores_take_all

Load = tuple[int, int, int, int]
"""(memory_mib held, slices held, CUs held, whole slices held) of one GPU."""

EMPTY_LOAD: Load = (0, 0, 0, 0)


class Reason(StrEnum):
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    NUMA_NOT_FIT = "NumaNotFit"
    LINK_NOT_FIT = "LinkNotFit"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    # Host resources, checked only where the node model tracks them (the benchmark).
    NODE_INSUFFICIENT_CPU = "NodeInsufficientCPU"
    NODE_INSUFFICIENT_MEMORY = "NodeInsufficientMemory"
    # Every GPU that could take the slice does, but there are fewer than the container asks.
    NODE_INSUFFICIENT_GPUS = "NodeInsufficientGPUs"


@dataclass(frozen=True, slots=True)
class GpuNeed:
    """What one container takes from one GPU of a given spec."""

    memory_mib: int
    pin_cus: int
    """CUs to pin with a mask; 0 = no mask (every CU)."""
    whole: bool
    reserves_all: bool
    """Omitted gpucores under Exclusive: needs every CU free and holds them all."""
    granted_cus: int
    """CUs the container may use (its DeviceSlice.cu_count)."""

    def load(self, spec: GpuSpec) -> Load:
        held = spec.cu_count if (self.whole or self.reserves_all) else self.pin_cus
        return (self.memory_mib, 1, held, 1 if self.whole else 0)


def need_for(spec: GpuSpec, container: ContainerRequest, omitted: OmittedCores) -> GpuNeed:
    if spec.partition or container.whole:
        # A partition is always one whole, unshared device; an explicit memory ask must still fit.
        return GpuNeed(memory_need_mib(container, spec.memory_mib, whole=True), 0, True, False, spec.cu_count)
    memory_mib = memory_need_mib(container, spec.memory_mib, whole=False)
    if container.cores_pct is not None:
        cus = cus_for_percent(container.cores_pct, spec)
        return GpuNeed(memory_mib, cus, False, False, cus)
    return GpuNeed(memory_mib, 0, False, omitted_cores_take_all(omitted), spec.cu_count)


def gpu_reason(spec: GpuSpec, load: Load, need: GpuNeed, selection: Selection) -> Reason | None:
    """The first reason this GPU cannot take the need, or None when it can."""
    barred = barred_reason(spec, selection)
    return barred if barred is not None else load_reason(spec, load, need)


def barred_reason(spec: GpuSpec, selection: Selection) -> Reason | None:
    """The part of gpu_reason no load changes: health, then the pod's type and uuid filters."""
    if not spec.healthy:
        return Reason.CARD_NOT_HEALTH
    if not selection.accepts_product(spec.product_lower):
        return Reason.CARD_TYPE_MISMATCH
    if (selection.use_uuids or selection.nouse_uuids) and not selection.accepts_uuid(spec.gpu_id):
        return Reason.CARD_UUID_MISMATCH
    return None


def load_reason(spec: GpuSpec, load: Load, need: GpuNeed) -> Reason | None:
    """The capacity part of gpu_reason (no selection filters)."""
    memory_held, slices, cu_held, whole = load
    if whole or (need.whole and slices):
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if slices >= spec.max_slices:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if memory_held + need.memory_mib > spec.memory_mib:
        return Reason.CARD_INSUFFICIENT_MEMORY
    if need.reserves_all and cu_held:
        return Reason.CARD_INSUFFICIENT_CORE
    if need.pin_cus and spec.cu_usable - cu_held < need.pin_cus:
        return Reason.CARD_INSUFFICIENT_CORE
    return None


def add_load(load: Load, need_load: Load) -> Load:
    return (load[0] + need_load[0], load[1] + need_load[1], load[2] + need_load[2], load[3] + need_load[3])


# ---- reasons summary ---------------------------------------------------------------------


_REASON_ORDER = {reason: rank for rank, reason in enumerate(Reason)}


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why a pod does not fit a node: reason -> number of GPUs, out of ``total`` GPUs."""

    reasons: tuple[tuple[Reason, int], ...]
    total: int

    @classmethod
    def of(cls, counts: Mapping[Reason, int], total: int) -> FitFailure:
        return cls(tuple(sorted(counts.items(), key=lambda item: _REASON_ORDER[item[0]])), total)

    def summary(self) -> list[str]:
        return format_reasons(self.reasons, self.total)


def format_reasons(reasons: Iterable[tuple[Reason, int]], total: int) -> list[str]:
    """``["2/8 CardInsufficientMemory", ...]``: n GPUs failing for a reason out of total."""
    return [f"{count}/{total} {reason.value}" for reason, count in reasons]


# ---- O(1) pre-check ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """Maxima over a node's usable GPUs; enough to reject most non-fitting nodes at once."""

    total: int
    free_whole: int
    """Healthy GPUs holding nothing."""
    open_gpus: int
    """Healthy GPUs that are not held whole and have a free slice."""
    max_free_memory_mib: int
    max_free_memory_pct: int
    max_free_cores_pct: int


def summarize(node: NodeInventory, loads: tuple[Load, ...]) -> NodeSummary:
    free_whole = open_gpus = max_mem = max_mem_pct = max_cu_pct = 0
    for spec, (memory_held, slices, cu_held, whole) in zip(node.gpus, loads):
        if not spec.healthy or whole or slices >= spec.max_slices:
            continue
        open_gpus += 1
        if not slices:
            free_whole += 1
        free_mem = spec.memory_mib - memory_held
        max_mem = max(max_mem, free_mem)
        if spec.memory_mib:
            max_mem_pct = max(max_mem_pct, free_mem * 100 // spec.memory_mib)
        if spec.cu_count:
            max_cu_pct = max(max_cu_pct, (spec.cu_count - cu_held) * 100 // spec.cu_count)
    return NodeSummary(len(node.gpus), free_whole, open_gpus, max_mem, max_mem_pct, max_cu_pct)


def may_fit(summary: NodeSummary, request: PodRequest) -> bool:
    """False only when no placement can exist (each container checked on its own)."""
    for container in request.containers:
        if not container.gpus:
            continue
        if container.whole:
            if summary.free_whole < container.gpus:
                return False
            continue
        if summary.open_gpus < container.gpus:
            return False
        if container.memory_mib is not None and container.memory_mib > summary.max_free_memory_mib:
            return False
        if container.memory_pct is not None and container.memory_pct > summary.max_free_memory_pct:
            return False
        if container.cores_pct is not None and container.cores_pct > summary.max_free_cores_pct:
            return False
    return True
