"""Placing a pod on one node: fit, GPU choice, score, and the committed AllocationRecord.

``plan_pod`` is the hot path (filter and prioritize): plain ints and tuples, no pydantic,
no CU ranges; ``PodPlanner`` is the same for one pod over many nodes, working out what
depends only on a node's shape once per shape. ``allocate`` (bind) re-plans against the
current ledger, picks concrete CU ranges best-fit, and builds the record with pydantic at
the edge.

Containers are placed one after another against a scratch copy of the node's loads, so two
containers of one pod may share a GPU (each holds its own slice). App containers and native
sidecars are placed first (they run together: their slices add up); then each plain init
container, whose devices lie over the pod's slots (rocshare.core.holdings.overlap_slots: the
kubelet's max(init, app), per slot): on the slot's GPU, growing the slot to the larger of the
two, with CU ranges inside the slot's before any free CU. The record lists init containers
first, as the kubelet asks for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.core.choose import choose_gpus
from rocshare.core.cu_layout import choose_cus
from rocshare.core.cumask import full_mask, mask_from_ranges, ranges_from_mask
from rocshare.core.fit import FitFailure, GpuNeed, Load, Reason, add_load, barred_reason, load_reason, need_for
from rocshare.core.headroom import free_share_milli
from rocshare.core.holdings import Slot, overlap_slots, slice_mask
from rocshare.core.inventory import GpuSpec, NodeInventory, ShapeKey
from rocshare.core.ledger import NodeUsage
from rocshare.core.policies import NODE_SCORERS, NodeView, Policy, ScoringContext, gpu_scorer_for, reads_headroom
from rocshare.core.request import ContainerRequest, PodRequest

DEFAULT_CONTEXT = ScoringContext()
_UNSEEN: Reason = object()  # type: ignore[assignment]  # a verdict not worked out yet (None means "fits")


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    position: int
    need: GpuNeed


@dataclass(frozen=True, slots=True)
class Plan:
    """Where each GPU container goes (positions on the node, in request.gpu_containers order)."""

    containers: tuple[tuple[PlannedDevice, ...], ...]
    loads_after: tuple[Load, ...]
    score: float


def plan_pod(
    node: NodeInventory,
    usage: NodeUsage,
    request: PodRequest,
    policy: Policy,
    ctx: ScoringContext = DEFAULT_CONTEXT,
) -> Plan | FitFailure:
    """Fit the whole pod on the node and score it; or the typed reasons it does not fit."""
    return PodPlanner(request, policy, ctx).plan(node, usage)


@dataclass(frozen=True, slots=True)
class _ContainerFit:
    """One container on one node shape: its need of each GPU and the load that need adds."""

    gpus: int
    needs: tuple[GpuNeed, ...]
    adds: tuple[Load, ...]
    unoffered: tuple[Reason | None, ...]
    """Per GPU: CardTypeMismatch where the GPU is not offered under the container's resource
    name (mixed naming: a partition kind, or amd.com/gpu on a node that names partitions)."""
    verdicts: dict[tuple[int, Load], Reason | None] = field(default_factory=dict, compare=False)
    """(twin, load) -> the GPU's reason or None (fits), for every node of this shape: twins under
    equal loads fit alike, and a fleet holds few distinct (GPU, load) pairs. Filled only for pods
    that filter by no GPU id (an id filter bars GPUs one by one, not by twin)."""


class PodPlanner:
    """``plan_pod`` for one pod and policy, asked about as many nodes as the caller likes.

    What depends only on a node's shape -- each container's need of each GPU, the load it
    adds, which GPUs are barred whatever their load (health, the pod's type filters) -- is
    worked out once per shape, not once per node. A shape leaves GPU ids out, so a pod with
    uuid filters has its barred GPUs worked out per node. The answers are exactly
    ``plan_pod``'s: the planner only remembers functions of the shape, never capacity.

    The first pod of a never-seen shape plans every node (issue 18's cold path), so per node it
    does little: each GPU's verdict is remembered per (twin, load) for all nodes of the shape (a
    fleet holds few distinct pairs), twins under equal loads are scored once, and free shares come
    from the ledger's usage, updated only for the GPUs a container takes.
    """

    def __init__(self, request: PodRequest, policy: Policy, ctx: ScoringContext = DEFAULT_CONTEXT) -> None:
        self.request = request
        self.policy = policy
        self.ctx = ctx
        self._gpu_scorer = gpu_scorer_for(policy)
        self._node_scorer = NODE_SCORERS[policy.node]
        self._reads_headroom = reads_headroom(policy)
        self._reads_ids = bool(request.selection.use_uuids or request.selection.nouse_uuids)
        self._shapes: dict[ShapeKey, tuple[tuple[_ContainerFit, ...], tuple[Reason | None, ...]]] = {}

    def plan(self, node: NodeInventory, usage: NodeUsage) -> Plan | FitFailure:
        host = _host_failure(node, usage, self.request)
        if host is not None:
            return host
        fits, barred = self.shape_facts(node)
        cpu_before = node.cpu_milli - usage.cpu_milli if node.cpu_milli else None
        cpu_after = cpu_before - self.request.cpu_milli if cpu_before is not None else None
        loads = list(usage.loads)
        free = list(usage.free_milli) if self._reads_headroom else []  # free shares under `loads`, in step
        placed: list[tuple[PlannedDevice, ...] | None] = [None] * len(fits)
        slots = self._slots(node)
        cpu = (cpu_before, cpu_after)
        peaks: dict[Slot, Load] = {}
        for index in [index for index in range(len(fits)) if index not in slots] + list(slots):
            result = (self._place_container(node, loads, free, fits[index], barred, cpu) if index not in slots
                      else self._place_init(node, loads, free, fits, (index, slots[index]), placed, peaks, barred, cpu))
            if isinstance(result, FitFailure):
                return result
            placed[index] = result
        view = NodeView(node, usage.loads, tuple(loads), cpu_before, cpu_after, usage.free_milli if free else (),
                        tuple(free))
        return Plan(tuple(placed), tuple(loads), self._node_scorer(view, self.request, self.ctx))

    def _slots(self, node: NodeInventory) -> dict[int, tuple[Slot | None, ...]]:
        """Per plain init container (by index in gpu_containers), the slot each device lies over
        (rocshare.core.holdings' rule, with the node's partitions counted whole)."""
        return _overlap_slots(node, self.request.gpu_containers)

    def _place_init(self, node: NodeInventory, loads: list[Load], free: list[int], fits: tuple[_ContainerFit, ...],
                    init: tuple[int, tuple[Slot | None, ...]], placed: list, peaks: dict[Slot, Load],
                    barred: tuple[Reason | None, ...],
                    cpu: tuple[int | None, int | None]) -> tuple[PlannedDevice, ...] | FitFailure:
        """A plain init container: each device over its slot's GPU, growing the slot to the larger
        of the two (it must fit there, or the pod does not fit the node); devices without a slot
        (or whose slot's GPU this container already has) are placed like an app container's."""
        index, slots = init
        fit = fits[index]
        over: list[PlannedDevice] = []
        for slot in slots:
            if slot is None:
                continue
            base = placed[slot[0]][slot[1]]
            pos = base.position
            if any(device.position == pos for device in over):
                continue
            peak = peaks.get(slot, fits[slot[0]].adds[pos])
            grown = _grown_load(loads[pos], peak, fit.adds[pos])
            reason = barred[pos] or fit.unoffered[pos] or _hold_reason(node.gpus[pos], grown)
            if reason is not None:
                return FitFailure.of({reason: len(node.gpus)}, len(node.gpus))
            peaks[slot] = _peak(peak, fit.adds[pos])
            loads[pos] = grown
            if free:
                free[pos] = free_share_milli(node.gpus[pos], grown)
            over.append(PlannedDevice(pos, fit.needs[pos]))
        rest = fit.gpus - len(over)
        if not rest:
            return tuple(over)
        more = self._place_container(node, loads, free, dataclasses.replace(fit, gpus=rest), barred, cpu,
                                     frozenset(device.position for device in over))
        return more if isinstance(more, FitFailure) else (*over, *more)

    def shape_facts(self, node: NodeInventory) -> tuple[tuple[_ContainerFit, ...], tuple[Reason | None, ...]]:
        """Per GPU container its need of each GPU of the node (`_ContainerFit`), and per GPU the
        reason no load changes (health, the pod's type and uuid filters), or None."""
        facts = self._shapes.get(node.shape)
        if facts is None:
            fits = tuple(_container_fit(node, container) for container in self.request.gpu_containers)
            facts = self._shapes[node.shape] = (fits, self._barred(node))
        if self._reads_ids:
            return facts[0], self._barred(node)
        return facts

    def _barred(self, node: NodeInventory) -> tuple[Reason | None, ...]:
        return tuple(barred_reason(spec, self.request.selection) for spec in node.gpus)

    def _place_container(
        self,
        node: NodeInventory,
        loads: list[Load],
        free: list[int],
        fit: _ContainerFit,
        barred: tuple[Reason | None, ...],
        cpu: tuple[int | None, int | None],
        taken: frozenset[int] = frozenset(),
    ) -> tuple[PlannedDevice, ...] | FitFailure:
        """`taken`: GPUs the container has already (an init container's devices over its slots)."""
        reasons: dict[Reason, int] = {}  # GPUs per reason (a plain dict: a Counter costs more to make)
        candidates: list[int] = []
        verdicts, twins = (None if self._reads_ids else fit.verdicts), node.twins
        for pos, load in enumerate(loads):
            if pos in taken:
                continue
            if verdicts is None:
                reason = barred[pos] or fit.unoffered[pos] or load_reason(node.gpus[pos], load, fit.needs[pos])
            else:
                key = (twins[pos], load)
                reason = verdicts.get(key, _UNSEEN)
                if reason is _UNSEEN:
                    reason = verdicts[key] = (barred[pos] or fit.unoffered[pos]
                                              or load_reason(node.gpus[pos], load, fit.needs[pos]))
            if reason is None:
                candidates.append(pos)
            else:
                reasons[reason] = reasons.get(reason, 0) + 1
        total = len(node.gpus)
        if len(candidates) < fit.gpus:
            if candidates or taken:  # no GPU check gives this reason: the fitting GPUs are counted once
                reasons[Reason.NODE_INSUFFICIENT_GPUS] = len(candidates) + len(taken)
            return FitFailure.of(reasons, total)
        frozen, frozen_free, scorer, ctx = tuple(loads), tuple(free), self._gpu_scorer, self.ctx
        scored: dict[tuple[int, Load], float] = {}  # twins under equal loads score alike: once

        def score(pos: int) -> float:
            key = (node.twins[pos], frozen[pos])
            found = scored.get(key)
            if found is None:
                load = add_load(frozen[pos], fit.adds[pos])
                after = frozen[:pos] + (load,) + frozen[pos + 1:]
                free_after = frozen_free[:pos] + (free_share_milli(node.gpus[pos], load),) + frozen_free[pos + 1:] \
                    if frozen_free else ()
                found = scored[key] = scorer(NodeView(node, frozen, after, *cpu, frozen_free, free_after), pos, ctx)
            return found

        chosen = choose_gpus(node, candidates, fit.gpus, self.request.selection, self.policy.gpu, score)
        if isinstance(chosen, Reason):  # a set reason (NUMA, link): no GPU check gives it either
            reasons[chosen] = len(candidates)
            return FitFailure.of(reasons, total)
        for pos in chosen:
            loads[pos] = add_load(loads[pos], fit.adds[pos])
            if free:
                free[pos] = free_share_milli(node.gpus[pos], loads[pos])
        return tuple(PlannedDevice(pos, fit.needs[pos]) for pos in chosen)


def _peak(a: Load, b: Load) -> Load:
    """The larger of two loads that never run at once (a slot and an init container over it)."""
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _grown_load(load: Load, slot_peak: Load, init: Load) -> Load:
    """The GPU's load once the slot (at `slot_peak` so far) grows to hold the init container too."""
    after = _peak(slot_peak, init)
    return (load[0] + after[0] - slot_peak[0], load[1], load[2] + after[2] - slot_peak[2], load[3])


def _hold_reason(spec: GpuSpec, load: Load) -> Reason | None:
    """Whether the GPU can hold `load` at all (memory, then CUs)."""
    if load[0] > spec.memory_mib:
        return Reason.CARD_INSUFFICIENT_MEMORY
    if load[2] > max(spec.cu_usable, spec.cu_count if load[3] else 0):
        return Reason.CARD_INSUFFICIENT_CORE
    return None


def _container_fit(node: NodeInventory, container: ContainerRequest) -> _ContainerFit:
    needs = tuple(need_for(spec, container, node.omitted_cores) for spec in node.gpus)
    unoffered = tuple(None if spec.resource == container.resource else Reason.CARD_TYPE_MISMATCH for spec in node.gpus)
    return _ContainerFit(container.gpus, needs, tuple(need.load(spec) for need, spec in zip(needs, node.gpus)),
                         unoffered)


def _host_failure(node: NodeInventory, usage: NodeUsage, request: PodRequest) -> FitFailure | None:
    total = len(node.gpus)
    if node.cpu_milli and usage.cpu_milli + request.cpu_milli > node.cpu_milli:
        return FitFailure.of({Reason.NODE_INSUFFICIENT_CPU: total}, total)
    if node.memory_mib and usage.memory_mib + request.memory_mib > node.memory_mib:
        return FitFailure.of({Reason.NODE_INSUFFICIENT_MEMORY: total}, total)
    return None


def allocate(
    node: NodeInventory,
    usage: NodeUsage,
    request: PodRequest,
    policy: Policy,
    ctx: ScoringContext = DEFAULT_CONTEXT,
) -> AllocationRecord | FitFailure:
    """The bind decision: GPUs and concrete CU ranges, as the record to write on the pod."""
    if not request.wants_gpus:
        raise ValueError(f"pod {request.namespace}/{request.name} asks for no GPU: nothing to allocate")
    plan = plan_pod(node, usage, request, policy, ctx)
    if isinstance(plan, FitFailure):
        return plan
    return record_from_plan(node, usage, request, plan)


def record_from_plan(node: NodeInventory, usage: NodeUsage, request: PodRequest, plan: Plan) -> AllocationRecord:
    """The record of a plan, CU ranges chosen best-fit: app containers and sidecars first (pod
    order), then each plain init container's, inside its slot's ranges before any free CU."""
    masks = [gpu.cu_mask for gpu in usage.gpus]
    containers = request.gpu_containers
    slots = _overlap_slots(node, containers)
    slices: list[list[DeviceSlice]] = [[] for _ in containers]
    spares: dict[Slot, int] = {}
    for index in [index for index in range(len(containers)) if index not in slots]:
        slices[index] = [_device_slice(node, masks, device, containers[index].cores_pct)
                         for device in plan.containers[index]]
    for index, over in slots.items():
        for device, slot in zip(plan.containers[index], _slots_taken(plan, over, len(plan.containers[index]))):
            if slot is None:
                slices[index].append(_device_slice(node, masks, device, containers[index].cores_pct))
                continue
            spare = spares.setdefault(slot, slice_mask(slices[slot[0]][slot[1]]))
            found = _device_slice(node, masks, device, containers[index].cores_pct, spare)
            spares[slot] = spare | slice_mask(found)
            slices[index].append(found)
    return AllocationRecord(node=node.name, oversubscribed=node.oversubscribed, containers=[
        ContainerAllocation(name=c.name, init=c.init, sidecar=c.sidecar, devices=devices)
        for c, devices in zip(containers, slices)])


def _overlap_slots(node: NodeInventory, containers: tuple[ContainerRequest, ...]) -> dict[int, tuple[Slot | None, ...]]:
    """`overlap_slots` on this node: on a node of partitions every device is whole. A node mixing
    partitions and GPUs lays no init container over a slot (whether a device is whole depends on
    the GPU chosen): there, init slices are summed, as the record then says."""
    partitions = [gpu.partition for gpu in node.gpus]
    if any(partitions) and not all(partitions):
        return {}
    return overlap_slots([(c.init, c.sidecar, c.gpus, c.whole or any(partitions)) for c in containers])


def _slots_taken(plan: Plan, over: tuple[Slot | None, ...], count: int) -> list[Slot | None]:
    """Per device of an init container, as `PodPlanner._place_init` placed them: first those over
    a slot (each slot's GPU once), then the rest, placed like an app container's (None)."""
    taken: list[Slot | None] = []
    for slot in over:
        if slot is not None and all(plan.containers[slot[0]][slot[1]].position
                                    != plan.containers[other[0]][other[1]].position for other in taken):
            taken.append(slot)
    return taken + [None] * (count - len(taken))


def _device_slice(node: NodeInventory, masks: list[int], device: PlannedDevice, cores_pct: int | None,
                  spare: int = 0) -> DeviceSlice:
    """`spare`: CUs the pod already holds there that this container may reuse (an init
    container's slot): its ranges are taken from them first, then from the GPU's free CUs."""
    spec = node.gpus[device.position]
    need = device.need
    ranges: list[tuple[int, int]] = []
    if need.pin_cus:
        ranges = _cu_ranges(masks[device.position], spare, spec, need.pin_cus)
        masks[device.position] |= mask_from_ranges(ranges)
    elif need.whole or need.reserves_all:
        masks[device.position] = full_mask(spec.cu_count)
    return DeviceSlice(
        gpu_id=spec.gpu_id,
        memory_mib=need.memory_mib,
        cu_ranges=ranges,
        cu_count=need.granted_cus,
        whole=need.whole,
        reserves_all_cores=need.reserves_all,
        cores_pct=cores_pct if need.pin_cus else None,
    )


def _cu_ranges(held: int, spare: int, spec: GpuSpec, count: int) -> list[tuple[int, int]]:
    """`count` CUs best-fit: inside `spare` when it has them, else all of `spare` and the rest free."""
    everything = full_mask(spec.cu_count)
    found = choose_cus(everything & ~spare, spec.cu_count, count, spec.cu_align, spec.cu_layout,
                       spec.topology) if spare else None
    if found is None:
        extra = choose_cus(held | spare, spec.cu_count, count - spare.bit_count(), spec.cu_align, spec.cu_layout,
                           spec.topology)
        if extra is None:  # plan_pod checked the count; only a corrupt ledger gets here
            raise ValueError(f"GPU {spec.gpu_id}: no {count} free CUs despite the plan")
        found = ranges_from_mask(spare | mask_from_ranges(extra))
    return found
