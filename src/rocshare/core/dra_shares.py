"""What a DRA claim's allocation becomes on the node: CU ranges, memory limit, whole or slice. Pure.

kube-scheduler's DRA allocator checks sums only (consumed memory, compute and shares against each
device's capacity). Which CUs a share gets is decided here, at prepare time, with the rule the
device-plugin path uses (rocshare.core.cu_layout.choose_cus: the pool's layout, whole WGPs on
RDNA), against the CUs the node's prepared claims already hold.

Invariants:

* CU ranges handed out are disjoint from every prepared claim's (``Holdings``), inside the
  GPU's CUs that whole WGPs cover, and of exactly the consumed count;
* a share that cannot be honoured exactly fails with a typed reason and holds nothing: a compute
  amount that is not whole WGPs (rounding up would take CUs the allocator did not count), no free
  gap of that size, a device held whole, a device that is not on this node;
* a claim that consumed the device's whole memory and every CU (no capacity asked, omittedCores
  Exclusive) gets the whole GPU: no mask, no limit, no hook, as a whole-GPU pod does;
* a compute amount of 0 (omittedCores Shared) pins no CU and holds none; every CU with less than all
  the memory (omittedCores Exclusive, compute not asked) pins no CU and holds them all, as the
  device plugin does (so the container's environment is the same in both modes);
* a device that is not shared (a partition, or no shareID) is held whole.

What a claim holds before the node has chosen its CUs (`counted_slices`, read by the operator's
accounts, quota and status) follows the same rules with no CU range: memory and the cores percent
of the consumed compute (``ceil(CUs x 100 / the GPU's CUs)``, never under the share), whole or
all-cores exactly as `plan_claim` will decide. Once the node has prepared the claim, its record on
the claim (``rocshare.io/allocation``, written by the agent) says which CUs, and nothing else: the
amounts are always the allocation's (`claim_holding`), so a record a tenant rewrote cannot shrink
what its namespace holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from rocshare.api import dra
from rocshare.api.allocation import (ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, ContainerAllocation,
                                     DeviceSlice, decode_record)
from rocshare.core.cu_layout import choose_cus
from rocshare.core.cumask import full_mask, mask_from_ranges, ranges_from_mask, render_ranges
from rocshare.core.holdings import slice_mask
from rocshare.core.inventory import GpuSpec
from rocshare.core.quantity import QuantityError, memory_mib_quantity, whole_quantity
from rocshare.core.share_rules import cores_percent

NOT_ON_NODE_REASON = "DeviceNotOnNode"
NOT_HONOURED_REASON = "ShareNotHonoured"
UNREADABLE_REASON = "AllocationUnreadable"


class ShareError(ValueError):
    """The claim cannot be prepared exactly; `reason` is one CamelCase word, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of a claim's status.allocation.devices.results for this driver and node."""

    request: str
    device: str
    share_id: str | None = None
    consumed: Mapping[str, str] | None = None
    """consumedCapacity as the API server stores it (quantity strings)."""

    @classmethod
    def from_result(cls, result: Mapping) -> AllocatedDevice:
        return cls(request=str(result.get("request", "")), device=str(result.get("device", "")),
                   share_id=result.get("shareID"), consumed=dict(result.get("consumedCapacity") or {}))


@dataclass(frozen=True, slots=True)
class Holdings:
    """What the node's prepared claims hold: CUs per gpu id, and the gpu ids held whole."""

    masks: Mapping[str, int]
    whole: frozenset[str] = frozenset()

    @classmethod
    def of(cls, prepared: Iterable[DeviceSlice], cu_counts: Mapping[str, int]) -> Holdings:
        masks: dict[str, int] = {}
        whole: set[str] = set()
        for device in prepared:
            if device.whole:
                whole.add(device.gpu_id)
            holds_all = device.whole or device.reserves_all_cores
            mask = full_mask(cu_counts.get(device.gpu_id, 0)) if holds_all else mask_from_ranges(device.cu_ranges)
            masks[device.gpu_id] = masks.get(device.gpu_id, 0) | mask
        return cls(masks=masks, whole=frozenset(whole))


def plan_claim(allocated: Iterable[AllocatedDevice], specs_by_device: Mapping[str, GpuSpec],
               holdings: Holdings) -> list[DeviceSlice]:
    """The slices for one claim, in allocation-result order, beside `holdings`. Raises ShareError."""
    taken = dict(holdings.masks)
    slices: list[DeviceSlice] = []
    for device in allocated:
        spec = specs_by_device.get(device.device)
        if spec is None:
            raise ShareError(NOT_ON_NODE_REASON, f"device {device.device} is not a healthy device of this node")
        if spec.gpu_id in holdings.whole:
            raise ShareError(NOT_HONOURED_REASON, f"device {device.device} is held whole by another claim")
        chosen = _slice_for(device, spec, taken.get(spec.gpu_id, 0))
        taken[spec.gpu_id] = taken.get(spec.gpu_id, 0) | slice_mask(chosen)
        slices.append(chosen)
    return slices


def counted_slices(allocated: Iterable[AllocatedDevice], specs_by_device: Mapping[str, GpuSpec]) -> list[DeviceSlice]:
    """What the claim holds as allocated, before CUs are chosen (no CU ranges; cores as a percent).
    Raises ShareError when a device is not the node's or its consumption cannot be read."""
    slices = []
    for device in allocated:
        spec = specs_by_device.get(device.device)
        if spec is None:
            raise ShareError(NOT_ON_NODE_REASON, f"device {device.device} is not a device of the node's AmdGpuNode")
        slices.append(_counted(device, spec))
    return slices


class ShareKind(Enum):
    """What an allocated device is to the container: the whole GPU, every CU with a memory limit,
    or a share (its CUs, possibly none)."""

    WHOLE = "whole"
    ALL_CORES = "all-cores"
    SHARED = "shared"


def share_kind(device: AllocatedDevice, spec: GpuSpec) -> tuple[ShareKind, int, int]:
    """The device's kind with the CUs and MiB it consumed: whole when the device is not shared (a
    partition, or no shareID) or the share consumed every CU whole WGPs cover and all the memory;
    every CU when it consumed those CUs but less memory; else a share. Prepare (`plan_claim`) and
    accounting (`counted_slices`) both read it. Raises ShareError on a consumption it cannot read."""
    if spec.partition or device.share_id is None:
        return ShareKind.WHOLE, spec.cu_count, spec.memory_mib
    compute_cus, memory_mib = _consumed_cus(device, spec), _consumed_mib(device, spec)
    if compute_cus >= spec.cu_usable:
        return (ShareKind.WHOLE if memory_mib >= spec.memory_mib else ShareKind.ALL_CORES), compute_cus, memory_mib
    return ShareKind.SHARED, compute_cus, memory_mib


def _counted(device: AllocatedDevice, spec: GpuSpec) -> DeviceSlice:
    kind, compute_cus, memory_mib = share_kind(device, spec)
    if kind is ShareKind.WHOLE:
        return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=spec.memory_mib, cu_count=spec.cu_count, whole=True)
    if kind is ShareKind.ALL_CORES:
        return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=memory_mib, cu_count=spec.cu_count, reserves_all_cores=True)
    return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=memory_mib, cu_count=compute_cus or spec.cu_count,
                       cores_pct=cores_percent(compute_cus, spec.cu_count) if compute_cus else None)


def _slice_for(device: AllocatedDevice, spec: GpuSpec, held_mask: int) -> DeviceSlice:
    kind, compute_cus, memory_mib = share_kind(device, spec)
    if kind is ShareKind.WHOLE:
        return _whole(device, spec, held_mask)
    if spec.memory_mib == 0:
        raise ShareError(NOT_HONOURED_REASON, f"device {device.device}: its VRAM size is unknown, so a share of it "
                                              f"has no memory limit to enforce; claim it whole")
    if kind is ShareKind.ALL_CORES:
        # Every CU with a memory limit (compute not asked, omittedCores Exclusive): as the device plugin
        # gives it, no mask and the whole compute range held.
        if held_mask:
            raise ShareError(NOT_HONOURED_REASON, f"device {device.device}: every CU is wanted but other claims "
                                                  f"hold {render_ranges(_ranges(held_mask))}")
        return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=memory_mib, cu_count=spec.cu_count, reserves_all_cores=True)
    if compute_cus == 0:
        return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=memory_mib, cu_count=spec.cu_count)
    ranges = choose_cus(held_mask, spec.cu_count, compute_cus, spec.cu_align, spec.cu_layout, spec.topology)
    if ranges is None:
        free = spec.cu_usable - bin(held_mask & full_mask(spec.cu_usable)).count("1")
        raise ShareError(NOT_HONOURED_REASON, f"device {device.device}: no {compute_cus} free CUs in whole units of "
                                              f"{spec.cu_align} ({free} free; held "
                                              f"{render_ranges(_ranges(held_mask)) or 'none'})")
    return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=memory_mib, cu_ranges=ranges, cu_count=compute_cus,
                       cores_pct=cores_percent(compute_cus, spec.cu_count))


def _whole(device: AllocatedDevice, spec: GpuSpec, held_mask: int) -> DeviceSlice:
    if held_mask:
        raise ShareError(NOT_HONOURED_REASON, f"device {device.device} is wanted whole but other claims hold CUs "
                                              f"{render_ranges(_ranges(held_mask))} of it")
    return DeviceSlice(gpu_id=spec.gpu_id, memory_mib=spec.memory_mib, cu_count=spec.cu_count, whole=True)


def _consumed_cus(device: AllocatedDevice, spec: GpuSpec) -> int:
    raw = (device.consumed or {}).get(dra.CAPACITY_COMPUTE)
    if raw is None:
        return spec.cu_usable  # no policy was applied (a claim from a cluster without consumable capacity)
    try:
        cus = whole_quantity(raw, name=f"consumedCapacity.{dra.CAPACITY_COMPUTE}", unit="CUs")
    except QuantityError as error:
        raise ShareError(UNREADABLE_REASON, f"device {device.device}: {error}") from None
    if cus % spec.cu_align or cus > spec.cu_usable:
        raise ShareError(NOT_HONOURED_REASON, f"device {device.device}: {cus} CUs is not whole WGPs of "
                                              f"{spec.cu_align} within the {spec.cu_usable} CUs they cover; rounding "
                                              f"up would take CUs the scheduler did not count")
    return cus


def _consumed_mib(device: AllocatedDevice, spec: GpuSpec) -> int:
    raw = (device.consumed or {}).get(dra.CAPACITY_MEMORY)
    if raw is None:
        return spec.memory_mib
    try:
        return memory_mib_quantity(raw, name=f"consumedCapacity.{dra.CAPACITY_MEMORY}")
    except QuantityError as error:
        raise ShareError(UNREADABLE_REASON, f"device {device.device}: {error}") from None


def _ranges(mask: int) -> list[tuple[int, int]]:
    return ranges_from_mask(mask)


@dataclass(frozen=True, slots=True)
class ClaimHolding:
    """What an allocated claim holds (`held`: a record, or why it cannot be read) and, when the
    record on the claim was not used, why (`ignored`: the caller logs it)."""

    held: AllocationRecord | str
    ignored: str | None = None


def claim_record(name: str, node: str, allocated: Iterable[AllocatedDevice], prepared: str | None,
                 specs_by_device: Mapping[str, GpuSpec]) -> AllocationRecord | str:
    """`claim_holding(...).held`."""
    return claim_holding(name, node, allocated, prepared, specs_by_device).held


def claim_holding(name: str, node: str, allocated: Iterable[AllocatedDevice], prepared: str | None,
                  specs_by_device: Mapping[str, GpuSpec]) -> ClaimHolding:
    """What an allocated claim holds on `node`, as a record (one container named after the claim).

    Counted from the claim's allocation (`counted_slices`: what the API server's allocator wrote,
    which a tenant cannot change). The annotation on the claim (``rocshare.io/allocation``, written
    by the node's agent at prepare, but an annotation all the same) supplies only the CU positions,
    and only when it agrees with the allocation device for device (same GPUs in the same order, same
    memory, CU count, cores percent, whole and all-cores flags; ranges covering exactly that many
    CUs of the GPU); otherwise it is ignored and said so. A string `held`: the allocation itself
    cannot be read (the claim then holds unknown GPUs: never read as free)."""
    try:
        slices = counted_slices(allocated, specs_by_device)
    except ShareError as error:
        return ClaimHolding(str(error))
    if not slices:
        return ClaimHolding("it has no device of the driver allocated")
    counted = AllocationRecord(node=node, containers=[ContainerAllocation(name=name, devices=slices)])
    if prepared is None:
        return ClaimHolding(counted)
    positions = _positions(prepared, node, slices, specs_by_device)
    if isinstance(positions, str):
        return ClaimHolding(counted, ignored=f"its record ({ALLOCATION_ANNOTATION}) is ignored: {positions}")
    return ClaimHolding(AllocationRecord(node=node, containers=[ContainerAllocation(name=name, devices=positions)]))


def _positions(prepared: str, node: str, counted: list[DeviceSlice],
               specs_by_device: Mapping[str, GpuSpec]) -> list[DeviceSlice] | str:
    """The counted slices with the record's CU ranges, or why the record does not match them."""
    try:
        record = decode_record(prepared)
    except AllocationError as error:
        return f"it cannot be read: {error}"
    if record.node != node:
        return f"it names node {record.node}, not {node}"
    devices = [device for container in record.containers for device in container.devices]
    if len(devices) != len(counted):
        return f"it lists {len(devices)} device(s), the allocation {len(counted)}"
    cu_counts = {spec.gpu_id: spec.cu_count for spec in specs_by_device.values()}
    for written, allocated in zip(devices, counted):
        if written.model_copy(update={"cu_ranges": []}) != allocated:
            return f"device {written.gpu_id} does not match the allocation ({allocated.gpu_id}, " \
                   f"{allocated.memory_mib} MiB, {allocated.cu_count} CUs)"
        mask = mask_from_ranges(written.cu_ranges)
        if written.cu_ranges and (bin(mask).count("1") != allocated.cu_count
                                  or mask & ~full_mask(cu_counts.get(allocated.gpu_id, 0))):
            return f"device {written.gpu_id}: CUs {render_ranges(written.cu_ranges)} are not " \
                   f"{allocated.cu_count} CUs of the GPU"
    return [allocated.model_copy(update={"cu_ranges": list(written.cu_ranges)})
            for written, allocated in zip(devices, counted)]
