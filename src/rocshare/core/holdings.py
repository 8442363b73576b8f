"""What a pod holds: the one rule every reader applies. Pure.

The extender's ledger and quota, share and pool status, the node agent's in-flight check and
the metrics all read a pod's hold from here, so they cannot disagree (docs/accounting.md).

From the allocation record (what bind committed), per GPU:
* a whole GPU or a partition (``whole``): all its registered memory, every CU, 100 % of cores;
* a CU slice: its memory, its CU ranges, the ``gpucores`` percent it asked (``coresPct``;
  records written before that field: ``ceil(CUs x 100 / the GPU's CUs)``, 100 when the
  GPU is unknown -- never under-count);
* omitted gpucores under Exclusive (``reservesAllCores``): its memory, every CU, 100 %;
* omitted gpucores under Shared: its memory only; it reserves no CU, so 0 % of cores.
App containers and native sidecars run together, so their slices are summed. A plain init
container runs before the app containers start, with only the sidecars declared before it, so
it is counted as Kubernetes counts it -- max(init, app) -- per slice it lies over: its device j
lies over the j-th *slot* of the pod (`overlap_slots`: the devices of the app containers and of
the sidecars declared after it, in pod order, of the same kind -- whole or slice), on the same
GPU, with CU ranges inside that slot's (plus whatever more it needs); the pod holds, per slot,
the larger of the slot and every init device over it, in memory, cores and CUs. An init device
with no slot (more init devices than slots), or one whose record puts it on another GPU than
its slot's, is summed like an app container's (never under-count). The allocator places init
containers by this rule, so what it plans is exactly what the record holds.

The GPU count is the one Kubernetes itself counts for ``requests.amd.com/gpu`` (the API
server's quota admission and the kubelet use it): max(the largest init container plus the
sidecars started before it, the app containers plus every sidecar). Native sidecars (init
containers with ``restartPolicy: Always``) run beside the app containers, so they count
with them.

A record that cannot be decoded gives a `Holding` with a ``problem`` and no GPUs: what it
holds is unknown, and every reader must treat it as holding everything it might (the
extender blocks its node, quota and status say the namespace cannot be accounted for).

A pod HAMi placed (no rocshare record, HAMi's ``hami.io/amd-devices-allocated``; see
rocshare.api.hami) holds what HAMi says, read into the same record form (`read_hami`): per
container and GPU its MiB; the CUs HAMi's plugin pinned (``hami.io/amd-cu-allocated``), or,
before the plugin wrote them, every CU of the GPU (where its CUs will be is unknown) counted as
100 % of cores. A pod with both records holds what rocshare's says. A HAMi record that cannot
be decoded, or names another node than the pod's, holds unknown GPUs, like a rocshare one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rocshare.api.allocation import AllocationError, AllocationRecord, ContainerAllocation, DeviceSlice, decode_record
from rocshare.api.hami import HamiFormatError, HamiPlacement, decode_cu_allocated, decode_pod_devices, rocshare_gpu_id
from rocshare.api.models import OmittedCores
from rocshare.api.pod_lifecycle import is_sidecar
from rocshare.core.cumask import full_mask, mask_from_ranges
from rocshare.core.quantity import QuantityError, cpu_milli_quantity, memory_mib_quantity
from rocshare.core.request import ContainerRequest, PodRequest, RequestError, parse_pod
from rocshare.core.share_rules import WHOLE_PCT, cores_percent, memory_need_mib, omitted_cores_pct


@dataclass(frozen=True, slots=True)
class Held:
    """A hold in quota units: MiB, percent of one GPU's compute (250 = 2.5 GPUs), GPU devices."""

    memory_mib: int = 0
    cores_pct: int = 0
    gpus: int = 0

    def __add__(self, other: Held) -> Held:
        return Held(self.memory_mib + other.memory_mib, self.cores_pct + other.cores_pct, self.gpus + other.gpus)

    def __sub__(self, other: Held) -> Held:
        return Held(self.memory_mib - other.memory_mib, self.cores_pct - other.cores_pct, self.gpus - other.gpus)


@dataclass(frozen=True, slots=True)
class GpuHold:
    """One pod's hold on one GPU (or partition), all its containers together."""

    gpu_id: str
    memory_mib: int
    slices: int
    cu_mask: int
    """CUs reserved (every CU for a whole GPU or an all-cores slice; none for a Shared slice)."""
    whole: int
    """Whole-GPU slices (0 or 1 unless records conflict)."""
    cores_pct: int | None
    """Percent of the GPU's compute held; None: a pre-coresPct CU slice, known from the GPU's CU count."""

    @property
    def cu_count(self) -> int:
        return self.cu_mask.bit_count()

    def cores_of(self, gpu_cu_count: int | None) -> int:
        if self.cores_pct is not None:
            return self.cores_pct
        if not gpu_cu_count:
            return WHOLE_PCT
        return cores_percent(self.cu_count, gpu_cu_count)


@dataclass(frozen=True, slots=True)
class Holding:
    """What one pod holds on its node. ``problem``: its record cannot be read (holds unknown GPUs)."""

    node: str
    gpus: tuple[GpuHold, ...] = ()
    gpu_count: int = 0
    problem: str | None = None

    @property
    def accountable(self) -> bool:
        return self.problem is None

    @property
    def memory_mib(self) -> int:
        return sum(gpu.memory_mib for gpu in self.gpus)

    @property
    def cu_count(self) -> int:
        return sum(gpu.cu_count for gpu in self.gpus)

    def held(self, gpu_cu_counts: Mapping[str, int] | None = None) -> Held:
        """In quota units; `gpu_cu_counts` (the node's GPU id -> CU count) is read only for records
        older than coresPct."""
        counts = gpu_cu_counts or {}
        return Held(self.memory_mib, sum(gpu.cores_of(counts.get(gpu.gpu_id)) for gpu in self.gpus),
                    self.gpu_count)


def slice_mask(device: DeviceSlice) -> int:
    """The CUs one slice reserves on its GPU."""
    if device.whole or device.reserves_all_cores:
        return full_mask(device.cu_count)
    return mask_from_ranges(device.cu_ranges)


def slice_cores_pct(device: DeviceSlice) -> int | None:
    """Percent of its GPU's compute one slice holds; None when only the GPU's CU count can tell."""
    if device.whole or device.reserves_all_cores:
        return WHOLE_PCT
    if device.cores_pct is not None:
        return device.cores_pct
    return 0 if not device.cu_ranges else None


Slot = tuple[int, int]
"""(container index, device index) of an app container's or sidecar's device."""


def is_plain_init(init: bool, sidecar: bool) -> bool:
    """An init container that runs to completion before the app containers start."""
    return init and not sidecar


def overlap_slots(containers: Sequence[tuple[bool, bool, int, bool]]) -> dict[int, tuple[Slot | None, ...]]:
    """For each plain init container (by index), the slot each of its devices lies over, or None
    (summed). `containers`: (init, sidecar, device count, whole) per container in pod order, init
    containers first. The slots of an init container are the devices of the app containers and
    of the sidecars declared after it (those not yet running beside it), in pod order, whose
    kind (whole device or slice) is its own; its device j lies over the j-th."""
    found: dict[int, tuple[Slot | None, ...]] = {}
    for index, (init, sidecar, count, whole) in enumerate(containers):
        if not is_plain_init(init, sidecar):
            continue
        slots = [(other, device) for other, (o_init, o_sidecar, o_count, o_whole) in enumerate(containers)
                 if (not o_init or (o_sidecar and other > index)) and o_whole == whole for device in range(o_count)]
        found[index] = tuple(slots[device] if device < len(slots) else None for device in range(count))
    return found


def record_holding(record: AllocationRecord) -> Holding:
    """The pod's hold, from its committed record: app and sidecar slices summed per GPU, each
    plain init container's slices over their slots (max, see the module docstring)."""
    containers = record.containers
    per_gpu: dict[str, GpuHold] = {}
    over: dict[Slot, list[DeviceSlice]] = {}
    slots = overlap_slots([(c.init, c.sidecar, len(c.devices), all(d.whole for d in c.devices)) for c in containers])
    for index, container in enumerate(containers):
        if index in slots:
            continue
        for device in container.devices:
            per_gpu[device.gpu_id] = _added(per_gpu.get(device.gpu_id), device)
    for index, devices in ((index, containers[index].devices) for index in slots):
        for device, slot in zip(devices, slots[index]):
            base = containers[slot[0]].devices[slot[1]] if slot is not None else None
            if base is not None and (base.gpu_id, base.whole) == (device.gpu_id, device.whole):
                over.setdefault(slot, []).append(device)
            else:
                per_gpu[device.gpu_id] = _added(per_gpu.get(device.gpu_id), device)
    for (index, position), inits in over.items():
        base = containers[index].devices[position]
        per_gpu[base.gpu_id] = _grown(per_gpu[base.gpu_id], base, inits)
    count = effective_gpus((c.init, c.sidecar, len(c.devices)) for c in containers)
    return Holding(record.node, tuple(per_gpu.values()), count)


def _grown(total: GpuHold, base: DeviceSlice, inits: list[DeviceSlice]) -> GpuHold:
    """The GPU's hold with one slot grown to the largest of itself and the init slices over it."""
    memory = max(0, max(device.memory_mib for device in inits) - base.memory_mib)
    mask = total.cu_mask
    for device in inits:
        mask |= slice_mask(device)
    pcts = [slice_cores_pct(device) for device in (base, *inits)]
    cores = None if total.cores_pct is None or None in pcts else total.cores_pct + max(0, max(pcts[1:]) - pcts[0])
    return GpuHold(total.gpu_id, total.memory_mib + memory, total.slices, mask, total.whole, cores)


@functools.lru_cache(maxsize=4096)
def read_record(text: str, node: str) -> tuple[AllocationRecord | None, Holding]:
    """A record as written on a pod bound to `node` (\"\" while unbound) and its hold. A record that
    cannot be decoded, or names another node, gives no record and a hold of unknown GPUs on `node`
    (``problem`` says why). Memoised by text: a text always reads the same (a resize writes a new
    text), and one pod event reaches several readers."""
    try:
        record = decode_record(text)
    except AllocationError as error:
        return None, Holding(node, problem=str(error))
    if node and record.node != node:
        return None, Holding(node, problem=f"its record names node {record.node} but it is bound to {node}")
    return record, record_holding(record)


def text_holding(text: str, node: str) -> Holding:
    """The hold of a record as written on a pod bound to `node` (see `read_record`)."""
    return read_record(text, node)[1]


def _added(total: GpuHold | None, device: DeviceSlice) -> GpuHold:
    mask, pct = slice_mask(device), slice_cores_pct(device)
    if total is None:
        return GpuHold(device.gpu_id, device.memory_mib, 1, mask, int(device.whole), pct)
    both = None if pct is None or total.cores_pct is None else total.cores_pct + pct
    return GpuHold(device.gpu_id, total.memory_mib + device.memory_mib, total.slices + 1, total.cu_mask | mask,
                   total.whole + int(device.whole), both)


def effective_gpus(containers: Iterable[tuple[bool, bool, int]]) -> int:
    """Kubernetes' count of a pod's devices from (init, sidecar, count) per container in pod order,
    init containers first: max(each init container with the sidecars started before it, the app
    containers with every sidecar). The same rule gives a pod's CPU and memory (`host_request`)."""
    init_peak = sidecars = app = 0
    for init, sidecar, count in containers:
        if init and sidecar:
            sidecars += count
            init_peak = max(init_peak, sidecars)
        elif init:
            init_peak = max(init_peak, sidecars + count)
        else:
            app += count
    return max(init_peak, app + sidecars)


@dataclass(frozen=True, slots=True)
class HostRequest:
    """A pod's host CPU (millicores) and memory (MiB), as kube-scheduler counts them on its node."""

    cpu_milli: int = 0
    memory_mib: int = 0


NO_HOST_REQUEST = HostRequest()


def host_request(spec: Mapping) -> HostRequest:
    """What a pod holds of its node's CPU and memory, kube-scheduler's rule: per resource,
    `effective_gpus`' max over init containers and app containers plus sidecars, each container's
    `requests` (its `limits` where it names no request: the API server defaults one to the
    other), plus `spec.overhead`. Raises RequestError naming the container and value."""
    cpu = _effective_host(spec, "cpu", cpu_milli_quantity)
    memory = _effective_host(spec, "memory", memory_mib_quantity)
    return HostRequest(cpu, memory) if cpu or memory else NO_HOST_REQUEST


def _effective_host(spec: Mapping, resource: str, read) -> int:
    containers = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or ():
            name = container.get("name", "?") if isinstance(container, Mapping) else "?"
            resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
            asked = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
            sidecar = isinstance(container, Mapping) and is_sidecar(container, init=init)
            containers.append((init, sidecar, _host_value(asked, read, f"container {name!r}: {resource}")))
    overhead = _host_value((spec.get("overhead") or {}).get(resource), read, f"spec.overhead.{resource}")
    return effective_gpus(containers) + overhead


def _host_value(raw: object, read, what: str) -> int:
    if raw is None:
        return 0
    try:
        return read(raw, name=what)
    except QuantityError as error:
        raise RequestError(str(error)) from None


def placement_request(pod: Mapping) -> PodRequest:
    """`parse_pod` with the pod's CPU and memory (`host_request`): what placement scores, as the
    simulator does. Raises RequestError."""
    request = parse_pod(pod)
    spec = pod.get("spec") or {}
    host = host_request(spec) if isinstance(spec, Mapping) else NO_HOST_REQUEST
    if host == NO_HOST_REQUEST:
        return request
    return dataclasses.replace(request, cpu_milli=host.cpu_milli, memory_mib=host.memory_mib)


def request_cost(request: PodRequest, *, gpu_memory_mib: int, omitted: OmittedCores,
                 whole_devices: bool = False) -> Held:
    """What the pod will hold once bound, in quota units: the same rule as `record_holding`,
    before GPUs are chosen. `gpu_memory_mib` stands for the memory of the GPUs it will get (a
    percentage or whole-GPU ask depends on it); `whole_devices`: the node serves partitions,
    each a whole device whatever the ask."""
    costs = [_container_cost(container, gpu_memory_mib, omitted, whole_devices) for container in request.containers]
    slots = overlap_slots([(c.init, c.sidecar, c.gpus, cost[2]) for c, cost in zip(request.containers, costs)])
    summed = [(cost, c.gpus) for index, (c, cost) in enumerate(zip(request.containers, costs)) if index not in slots]
    memory = sum(cost[0] * gpus for cost, gpus in summed)
    cores = sum(cost[1] * gpus for cost, gpus in summed)
    peaks: dict[Slot, tuple[int, int]] = {}
    for index, over in slots.items():
        init_mib, init_pct, _whole = costs[index]
        for slot in over:
            if slot is None:
                memory, cores = memory + init_mib, cores + init_pct
                continue
            base_mib, base_pct, _ = costs[slot[0]]
            was_mib, was_pct = peaks.get(slot, (base_mib, base_pct))
            peaks[slot] = (max(was_mib, init_mib), max(was_pct, init_pct))
    for slot, (peak_mib, peak_pct) in peaks.items():
        memory += peak_mib - costs[slot[0]][0]
        cores += peak_pct - costs[slot[0]][1]
    count = effective_gpus((c.init, c.sidecar, c.gpus) for c in request.containers)
    return Held(memory, cores, count)


def _container_cost(container: ContainerRequest, gpu_memory_mib: int, omitted: OmittedCores,
                    whole_devices: bool) -> tuple[int, int, bool]:
    """(MiB, cores percent, whole) one container holds on each of its GPUs."""
    whole = whole_devices or container.whole
    per_gpu_mib = memory_need_mib(container, gpu_memory_mib, whole=whole)
    if whole:
        pct = WHOLE_PCT
    elif container.cores_pct is not None:
        pct = container.cores_pct
    else:
        pct = omitted_cores_pct(omitted)
    return per_gpu_mib, pct, whole


def asked_devices(request: PodRequest) -> list[tuple[str, int]]:
    """(container, GPU count) of each container asking for GPUs, init containers first: what the
    kubelet will ask the device plugin for, in its order."""
    return [(c.name, c.gpus) for c in request.gpu_containers]


def committed_devices(record: AllocationRecord) -> list[tuple[str, int]]:
    """(container, GPU count) the record commits, in the same order as `asked_devices`."""
    return [(c.name, len(c.devices)) for c in record.containers]


UNKNOWN_CUS_RANGE = (0, 4095)
"""Every CU a GPU could have: what a HAMi slice reserves before HAMi's plugin says which CUs it
pinned. Readers clip masks to the GPU's real CU count (`Ledger.usage`)."""


@functools.lru_cache(maxsize=4096)
def read_hami(placement: HamiPlacement, node: str) -> tuple[AllocationRecord | None, Holding]:
    """A pod HAMi placed, bound to `node` ("" while unbound: then HAMi's chosen node), as a record
    and its hold; an undecodable one holds unknown GPUs (``problem``). Memoised like `read_record`."""
    where = node or placement.node
    if placement.node and node and placement.node != node:
        return None, Holding(node, problem=f"its hami.io/vgpu-node names {placement.node} but it is bound to {node}")
    try:
        record = _hami_record(placement, where)
    except (HamiFormatError, AllocationError, ValueError) as error:
        return None, Holding(where, problem=f"its HAMi allocation cannot be read: {error}")
    return record, record_holding(record)


def _hami_record(placement: HamiPlacement, node: str) -> AllocationRecord:
    if not node:
        raise HamiFormatError("it names no node (no hami.io/vgpu-node and not bound)")
    pinned = decode_cu_allocated(placement.cu_allocated) if placement.cu_allocated is not None else None
    containers = []
    seen: set[str] = set()
    for index, devices in enumerate(decode_pod_devices(placement.devices)):
        if not devices:
            continue
        name, init, sidecar = (placement.containers[index] if index < len(placement.containers)
                               else (f"hami-container-{index}", False, False))
        slices = [_hami_slice(rocshare_gpu_id(device.uuid), device.memory_mib, device.cu_count, pinned, seen)
                  for device in devices]
        containers.append(ContainerAllocation(name=name or f"hami-container-{index}", init=init, sidecar=sidecar,
                                              devices=slices))
    if not containers:
        raise HamiFormatError("hami.io/amd-devices-allocated names no device")
    return AllocationRecord(node=node, containers=containers)


def _hami_slice(gpu_id: str, memory_mib: int, cu_count: int, pinned: dict[str, list[tuple[int, int]]] | None,
                seen: set[str]) -> DeviceSlice:
    if memory_mib < 0 or cu_count < 0:
        raise HamiFormatError(f"device {gpu_id}: negative memory or CU count")
    first = gpu_id not in seen
    seen.add(gpu_id)
    if pinned is not None and gpu_id in pinned:
        # The plugin records CUs per pod and GPU: the pod's first slice there carries them (masks are OR-ed).
        return DeviceSlice(gpu_id=gpu_id, memory_mib=memory_mib, cu_count=cu_count,
                           cu_ranges=pinned[gpu_id] if first else [])
    # Not served yet (or the plugin recorded nothing for this GPU): its CUs could be any, so it holds
    # them all -- no CU is ever handed out twice.
    return DeviceSlice(gpu_id=gpu_id, memory_mib=memory_mib, cu_count=cu_count, cu_ranges=[UNKNOWN_CUS_RANGE],
                       cores_pct=WHOLE_PCT)
