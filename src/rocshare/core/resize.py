"""Resizing a running pod's slice: the decision, made as bind decides a placement. Pure.

A resize request (rocshare.api.resize) names one container of a bound pod and its new memory
per GPU and/or gpucores percent. It must fit where the container already is -- the same GPUs --
so the decision reads the node's GPUs, what every other pod holds of them, and the namespace's
quota, and returns the new allocation record or a refusal with its reason:

* memory: a GPU whose hold grows must keep the pod's new hold plus every neighbour's within the
  GPU's registered memory (``ResizeInsufficientMemory``);
* CUs: a slice that grows keeps its own CUs and adds free ones *next to them* under the pool's
  layout (``Packed``: the free bits adjoining its ranges first; ``Isolated``: free bits of the
  XCCs, engines or arrays it already uses first), never one a neighbour holds; when there are not
  enough free bits: ``ResizeInsufficientCores``. A slice that shrinks keeps its lowest CUs;
* quota: what the pod holds after, less what it holds now, is asked of the namespace's share the
  way a new pod's cost is (rocshare.core.quota), only for the terms that grow
  (``ResizeQuotaExceeded``). A shrink is always allowed, even below what the container holds:
  the memory hook then refuses new allocations until use is under the new limit; it never frees
  memory behind the program's back.

What a pod holds before and after is rocshare.core.holdings' one rule (`record_holding`), so the
ledger, quota, share status and metrics follow the new record exactly. While the new record is on
its way to the API server the extender holds `covering` -- each slice at the larger of before and
after, CUs of both -- so nothing is handed to a neighbour that either record holds, and nothing
is counted twice (the covering record replaces the old one, it is not added to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.api.models import CuLayout, ShareLimits
from rocshare.api.resize import ResizeRequest
from rocshare.core.cu_layout import choose_cus
from rocshare.core.cumask import full_mask, mask_from_ranges, ranges_from_mask, render_ranges
from rocshare.core.holdings import Held, is_plain_init, record_holding, slice_mask
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.ledger import EMPTY_GPU, GpuUsage
from rocshare.core.quota import check_quota
from rocshare.core.share_rules import cus_for_percent

INSUFFICIENT_MEMORY_REASON = "ResizeInsufficientMemory"
INSUFFICIENT_CORES_REASON = "ResizeInsufficientCores"
QUOTA_EXCEEDED_REASON = "ResizeQuotaExceeded"
INVALID_REQUEST_REASON = "ResizeInvalidRequest"
WHOLE_DEVICE_REASON = "ResizeWholeDevice"
DRA_CLAIM_REASON = "ResizeDraClaim"
REASONS = (INSUFFICIENT_MEMORY_REASON, INSUFFICIENT_CORES_REASON, QUOTA_EXCEEDED_REASON, INVALID_REQUEST_REASON,
           WHOLE_DEVICE_REASON, DRA_CLAIM_REASON)
"""Why a resize is refused: the reason of the pod's rocshare.io/Resized condition (False) and Event."""

DRA_MESSAGE = ("the pod's GPUs come from a DRA ResourceClaim, whose consumed capacity is fixed by the claim's "
               "allocation; a claim cannot be resized: make a new claim (and pod) with the capacity you need")


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Resized:
    record: AllocationRecord
    summary: str
    """What changed, for the condition and the Event: per GPU, memory and CUs before -> after."""


@dataclass(frozen=True, slots=True)
class Neighbours:
    """What every other pod holds of the node's GPUs, and the namespace's quota."""

    others: Mapping[str, GpuUsage]
    """GPU id -> the sum of every other pod's hold (rocshare.core.ledger), the pod itself left out."""
    limits: ShareLimits
    used: Held
    """The namespace's use now, this pod's current hold included."""


def decide_resize(record: AllocationRecord, request: ResizeRequest, node: NodeInventory,
                  neighbours: Neighbours) -> Resized | Refusal:
    """The pod's new record (``resizeGeneration`` = the request's), or why not."""
    found = _container(record, request.container)
    if isinstance(found, Refusal):
        return found
    index = found
    specs = {gpu.gpu_id: gpu for gpu in node.gpus}
    container = record.containers[index]
    missing = [d.gpu_id for d in container.devices if d.gpu_id not in specs]
    if missing:
        return Refusal(INVALID_REQUEST_REASON,
                       f"node {node.name} no longer lists GPU(s) {', '.join(missing)} of container '{container.name}'")
    pod_masks = {hold.gpu_id: hold.cu_mask for hold in record_holding(record).gpus}
    devices = []
    for device in container.devices:
        others = neighbours.others.get(device.gpu_id, EMPTY_GPU)
        resized = _resized_device(device, request, specs[device.gpu_id], others, pod_masks.get(device.gpu_id, 0))
        if isinstance(resized, Refusal):
            return resized
        devices.append(resized)
    containers = list(record.containers)
    containers[index] = container.model_copy(update={"devices": devices})
    new = record.model_copy(update={"containers": containers, "resize_generation": request.generation})
    return _checked(record, new, specs, neighbours) or Resized(new, _summary(container, devices))


def _container(record: AllocationRecord, name: str | None) -> int | Refusal:
    """The index of the container to resize in the record, or why there is none."""
    running = [(i, c) for i, c in enumerate(record.containers) if not is_plain_init(c.init, c.sidecar)]
    if name is not None:
        if not any(c.name == name for c in record.containers):
            held = ", ".join(c.name for c in record.containers)
            return Refusal(INVALID_REQUEST_REASON,
                           f"container '{name}' holds no GPU in this pod (those that do: {held})")
        index = next(i for i, c in enumerate(record.containers) if c.name == name)
        if is_plain_init(record.containers[index].init, record.containers[index].sidecar):
            return Refusal(INVALID_REQUEST_REASON, f"'{name}' is an init container: it ran before the app and holds "
                                                   f"its slice no longer; resize an app container or a sidecar")
        return _sliced(record.containers[index], index)
    sliced = [(i, c) for i, c in running if not all(d.whole for d in c.devices)]
    if len(sliced) != 1:
        names = ", ".join(c.name for _, c in sliced) or "none"
        return Refusal(INVALID_REQUEST_REASON if sliced else WHOLE_DEVICE_REASON,
                       f"name the container to resize (--container): containers holding a GPU slice: {names}")
    return sliced[0][0]


def _sliced(container: ContainerAllocation, index: int) -> int | Refusal:
    if any(d.whole for d in container.devices):
        return Refusal(WHOLE_DEVICE_REASON, f"container '{container.name}' holds whole GPUs or partitions, which "
                                            f"have no memory or compute limit to change; a resize applies to a slice")
    return index


def _resized_device(device: DeviceSlice, request: ResizeRequest, spec: GpuSpec, others: GpuUsage,
                    pod_mask: int) -> DeviceSlice | Refusal:
    memory_mib = device.memory_mib if request.memory_mib is None else request.memory_mib
    if request.cores_pct is None:
        return device.model_copy(update={"memory_mib": memory_mib})
    need = cus_for_percent(request.cores_pct, spec)
    own = slice_mask(device) & full_mask(spec.cu_count)
    if need <= own.bit_count():
        mask = _keep_lowest(own, need, spec.cu_align)
    else:
        # Taken: every neighbour's CUs and the pod's other containers' on this GPU.
        taken = others.cu_mask | (pod_mask & ~own)
        added = _grow(own, taken, spec, need - own.bit_count())
        if added is None:
            free = (full_mask(spec.cu_count) & ~(taken | own)).bit_count()
            return Refusal(INSUFFICIENT_CORES_REASON, f"GPU {spec.gpu_id}: {request.cores_pct} % is {need} of its "
                                               f"{spec.cu_count} CUs; the container has {own.bit_count()} and "
                                               f"{free} more are free beside its neighbours'")
        mask = own | added
    return DeviceSlice(gpu_id=device.gpu_id, memory_mib=memory_mib, cu_ranges=ranges_from_mask(mask),
                       cu_count=need, cores_pct=request.cores_pct)


def _grow(own: int, taken: int, spec: GpuSpec, extra: int) -> int | None:
    """`extra` free CUs next to `own` under the GPU's layout, else anywhere free; None: not enough."""
    total, align = spec.cu_count, spec.cu_align
    held = taken | own
    if spec.cu_layout == CuLayout.ISOLATED and spec.topology is not None:
        scope = _units_touching(own, spec.topology.levels())
        if scope:
            beside = choose_cus(held | (full_mask(total) & ~scope), total, extra, align, spec.cu_layout, spec.topology)
            if beside is not None:
                return mask_from_ranges(beside)
    else:
        adjoining = _adjoining(own, held, total, extra, align)
        if adjoining is not None:
            return adjoining
    anywhere = choose_cus(held, total, extra, align, spec.cu_layout, spec.topology)
    return None if anywhere is None else mask_from_ranges(anywhere)


def _units_touching(own: int, levels: tuple[tuple[int, ...], ...]) -> int:
    """The bits of the outermost units (XCCs, or engines) that hold some of `own`."""
    if not own or not levels:
        return 0
    scope = 0
    for unit in levels[0]:
        if unit & own:
            scope |= unit
    return scope


def _adjoining(own: int, held: int, total: int, extra: int, align: int) -> int | None:
    """Free aligned units growing `own`'s ranges upward, then downward, until `extra` CUs; None when
    the free bits adjoining its ranges are fewer."""
    if not own:
        return None
    unit = (1 << align) - 1
    chosen = 0
    for low, high in ranges_from_mask(own):
        for start, step in ((high + 1, align), (low - align, -align)):
            bit = start
            while chosen.bit_count() < extra and 0 <= bit and bit + align <= total \
                    and not (held | chosen) & (unit << bit):
                chosen |= unit << bit
                bit += step
        if chosen.bit_count() >= extra:
            return chosen
    return None


def _keep_lowest(own: int, need: int, align: int) -> int:
    """The lowest `need` CUs of `own`, a whole aligned unit at a time."""
    kept = 0
    unit = (1 << align) - 1
    bit = 0
    while kept.bit_count() < need and own >> bit:
        if (own >> bit) & unit == unit:
            kept |= unit << bit
        bit += align
    return kept


def _checked(old: AllocationRecord, new: AllocationRecord, specs: Mapping[str, GpuSpec],
             neighbours: Neighbours) -> Refusal | None:
    """Memory on each GPU whose hold grows, then the namespace's quota for the terms that grow."""
    before = {hold.gpu_id: hold for hold in record_holding(old).gpus}
    after = record_holding(new)
    for hold in after.gpus:
        if hold.memory_mib <= before[hold.gpu_id].memory_mib:
            continue
        spec = specs[hold.gpu_id]
        others = neighbours.others.get(hold.gpu_id, EMPTY_GPU).memory_mib
        if others + hold.memory_mib > spec.memory_mib:
            most = max(0, spec.memory_mib - others)
            return Refusal(INSUFFICIENT_MEMORY_REASON,
                           f"GPU {spec.gpu_id}: the pod would hold {hold.memory_mib} MiB and its neighbours hold "
                           f"{others} MiB of its {spec.memory_mib} MiB ({most} MiB is the most this pod can have)")
    cu_counts = {gpu_id: spec.cu_count for gpu_id, spec in specs.items()}
    grown = after.held(cu_counts) - record_holding(old).held(cu_counts)
    asked = Held(max(0, grown.memory_mib), max(0, grown.cores_pct), max(0, grown.gpus))
    # A term that does not grow is not asked, even where the namespace is over (its limit lowered since).
    limits = neighbours.limits.model_copy(update={
        "memory_mib": neighbours.limits.memory_mib if asked.memory_mib else None,
        "cores_pct": neighbours.limits.cores_pct if asked.cores_pct else None,
        "gpus": neighbours.limits.gpus if asked.gpus else None})
    verdict = check_quota(asked, limits, neighbours.used)
    if verdict is not None:
        return Refusal(QUOTA_EXCEEDED_REASON, f"the namespace's AmdGpuShare would be exceeded: {verdict.message}")
    return None


def covering(old: AllocationRecord, new: AllocationRecord) -> AllocationRecord:
    """What the extender holds while `new` is being written: every slice at the larger of the two
    (memory, cores) with the CUs of both, so neither record's room goes to a neighbour meanwhile."""
    containers = []
    for before, after in zip(old.containers, new.containers):
        devices = [_larger(a, b) for a, b in zip(before.devices, after.devices)]
        containers.append(after.model_copy(update={"devices": devices}))
    return new.model_copy(update={"containers": containers})


def _larger(a: DeviceSlice, b: DeviceSlice) -> DeviceSlice:
    if a == b:
        return b
    mask = slice_mask(a) | slice_mask(b)
    pcts = [d.cores_pct for d in (a, b) if d.cores_pct is not None]
    return DeviceSlice(gpu_id=b.gpu_id, memory_mib=max(a.memory_mib, b.memory_mib), cu_ranges=ranges_from_mask(mask),
                       cu_count=max(a.cu_count, b.cu_count, mask.bit_count()),
                       reserves_all_cores=a.reserves_all_cores or b.reserves_all_cores,
                       cores_pct=max(pcts) if pcts else None)


def _summary(before: ContainerAllocation, devices: list[DeviceSlice]) -> str:
    parts = []
    for old, new in zip(before.devices, devices):
        cus = (f"{old.cu_count} -> {new.cu_count} CUs ({render_ranges(new.cu_ranges) or 'all'})"
               if old.cu_ranges != new.cu_ranges or old.cu_count != new.cu_count else f"{new.cu_count} CUs")
        parts.append(f"GPU {new.gpu_id}: {old.memory_mib} -> {new.memory_mib} MiB, {cus}")
    return f"container '{before.name}': " + "; ".join(parts)
