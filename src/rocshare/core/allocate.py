"""Placing a pod on one node: fit, GPU choice, score, and the committed AllocationRecord.

``plan_pod`` is the hot path (filter and prioritize): plain ints and tuples, no pydantic,
no CU ranges. ``allocate`` (bind) re-plans against the current ledger, picks concrete CU
ranges best-fit, and builds the record with pydantic at the edge.

Containers are placed one after another against a scratch copy of the node's loads, so two
containers of one pod may share a GPU (each holds its own slice). Init containers are placed
first and keep their slices (the ledger reserves the sum: conservative, never less than
the kubelet's max(init, sum of app containers)); the record lists them first, as required.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.core.choose import choose_gpus
from rocshare.core.cumask import choose_cu_ranges, full_mask, mask_from_ranges
from rocshare.core.fit import FitFailure, GpuNeed, Load, Reason, add_load, gpu_reason, need_for
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import NodeUsage
from rocshare.core.policies import NODE_SCORERS, NodeView, Policy, ScoringContext, gpu_scorer_for
from rocshare.core.request import ContainerRequest, PodRequest

DEFAULT_CONTEXT = ScoringContext()


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
    host = _host_failure(node, usage, request)
    if host is not None:
        return host
    cpu_before = node.cpu_milli - usage.cpu_milli if node.cpu_milli else None
    cpu_after = cpu_before - request.cpu_milli if cpu_before is not None else None
    loads = list(usage.loads)
    placed: list[tuple[PlannedDevice, ...]] = []
    for container in request.gpu_containers:
        result = _place_container(node, loads, container, request, policy, ctx, (cpu_before, cpu_after))
        if isinstance(result, FitFailure):
            return result
        placed.append(result)
    view = NodeView(node, usage.loads, tuple(loads), cpu_before, cpu_after)
    score = NODE_SCORERS[policy.node](view, request, ctx)
    return Plan(tuple(placed), tuple(loads), score)


def _host_failure(node: NodeInventory, usage: NodeUsage, request: PodRequest) -> FitFailure | None:
    total = len(node.gpus)
    if node.cpu_milli and usage.cpu_milli + request.cpu_milli > node.cpu_milli:
        return FitFailure.of({Reason.NODE_INSUFFICIENT_CPU: total}, total)
    if node.memory_mib and usage.memory_mib + request.memory_mib > node.memory_mib:
        return FitFailure.of({Reason.NODE_INSUFFICIENT_MEMORY: total}, total)
    return None


def _place_container(
    node: NodeInventory,
    loads: list[Load],
    container: ContainerRequest,
    request: PodRequest,
    policy: Policy,
    ctx: ScoringContext,
    cpu: tuple[int | None, int | None],
) -> tuple[PlannedDevice, ...] | FitFailure:
    selection = request.selection
    needs = [need_for(spec, container, node.omitted_cores) for spec in node.gpus]
    reasons: Counter[Reason] = Counter()
    candidates: list[int] = []
    for pos, spec in enumerate(node.gpus):
        reason = gpu_reason(spec, loads[pos], needs[pos], selection)
        if reason is None:
            candidates.append(pos)
        else:
            reasons[reason] += 1
    total = len(node.gpus)
    if len(candidates) < container.gpus:
        if candidates:
            reasons[Reason.NODE_INSUFFICIENT_GPUS] += len(candidates)
        return FitFailure.of(reasons, total)
    scorer = gpu_scorer_for(policy)
    frozen = tuple(loads)

    def score(pos: int) -> float:
        after = frozen[:pos] + (add_load(frozen[pos], needs[pos].load(node.gpus[pos])),) + frozen[pos + 1:]
        return scorer(NodeView(node, frozen, after, *cpu), pos, ctx)

    chosen = choose_gpus(node, candidates, container.gpus, selection, policy.gpu, score)
    if isinstance(chosen, Reason):
        reasons[chosen] += len(candidates)
        return FitFailure.of(reasons, total)
    for pos in chosen:
        loads[pos] = add_load(loads[pos], needs[pos].load(node.gpus[pos]))
    return tuple(PlannedDevice(pos, needs[pos]) for pos in chosen)


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
    masks = [gpu.cu_mask for gpu in usage.gpus]
    containers = []
    for container, devices in zip(request.gpu_containers, plan.containers):
        slices = [_device_slice(node, masks, device) for device in devices]
        containers.append(ContainerAllocation(name=container.name, init=container.init, devices=slices))
    return AllocationRecord(node=node.name, containers=containers, oversubscribed=node.oversubscribed)


def _device_slice(node: NodeInventory, masks: list[int], device: PlannedDevice) -> DeviceSlice:
    spec = node.gpus[device.position]
    need = device.need
    ranges: list[tuple[int, int]] = []
    if need.pin_cus:
        found = choose_cu_ranges(masks[device.position], spec.cu_count, need.pin_cus, spec.cu_align)
        if found is None:  # plan_pod checked the count; only a corrupt ledger gets here
            raise ValueError(f"GPU {spec.gpu_id}: no {need.pin_cus} free CUs despite the plan")
        ranges = found
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
    )
