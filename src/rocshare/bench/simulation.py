"""The placement simulation: the FGD paper's protocol, run through rocshare's own allocator.

Protocol (../shared/traces/openb/README.md): the trace's GPU nodes; per seed, the pod list
shuffled, then pods drawn with replacement until the next would push requested GPU past
130 % of capacity; pods submitted one at a time, no departures, no retries; a pod that fits
nowhere fails and still counts as arrived. Allocation ratio = allocated GPU-milli / total,
read when arrivals reach 100 % and 130 %; fragmentation ratio read at 80 %.

Mapping onto AMD terms: every trace GPU becomes a CDNA GPU with 100 CUs and the model's VRAM
(a multiple of 100 MiB), so a trace share of m milli asks ``amd.com/gpumem-percentage`` and
``amd.com/gpucores`` of m/10 -- both exact, so results compare with the paper's. A
1000-milli GPU asks for whole GPUs (no memory, no cores). gpu_spec becomes
``amd.com/use-gputype``; node CPU and memory are checked as kube-scheduler's fit would.
splitCount is the default 10.

Each decision runs the core's plan_pod on every node (memoised per node and pod shape until
that node changes, as the extender may), picks the best score with random tie-breaks (as
kube-scheduler does), then builds the AllocationRecord and applies it to a Ledger.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rocshare.api.models import GpuPolicy
from rocshare.core.allocate import Plan, plan_pod, record_from_plan
from rocshare.core.fit import may_fit, summarize
from rocshare.core.fragmentation import MILLI, FragmentationModel, TypicalWorkload, free_share_milli
from rocshare.core.ids import GpuId, NodeName, PodKey
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.ledger import Ledger, NodeUsage
from rocshare.core.policies import NodeScorer, Policy, ScoringContext
from rocshare.core.request import ContainerRequest, PodRequest, Selection
from rocshare.bench.trace import TraceNode, TracePod

CU_COUNT = 100
MODEL_VRAM_MIB = {"P100": 16300, "T4": 15100, "V100M16": 16200, "V100M32": 32500, "A10": 22700, "G2": 16300, "G3": 32500}
DEFAULT_VRAM_MIB = 16000
ARRIVAL_LIMIT = 1.30
READ_POINTS = (1.00, 1.30)
FRAGMENTATION_POINT = 0.80

POLICIES: dict[str, Policy] = {
    "bestfit": Policy(NodeScorer.BESTFIT, GpuPolicy.BINPACK),
    "binpack": Policy(NodeScorer.BINPACK, GpuPolicy.BINPACK),
    "spread": Policy(NodeScorer.SPREAD, GpuPolicy.SPREAD),
    "topology-aware": Policy(NodeScorer.BINPACK, GpuPolicy.TOPOLOGY_AWARE),
    "fgd": Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE),
    "fragmentation-aware": Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE),
}
BEST = "fragmentation-aware"


def build_inventory(node: TraceNode) -> NodeInventory:
    vram = MODEL_VRAM_MIB.get(node.model, DEFAULT_VRAM_MIB)
    gpus = tuple(
        GpuSpec(gpu_id=GpuId(f"{node.name}/gpu{i}"), index=i, memory_mib=vram, cu_count=CU_COUNT, product=node.model)
        for i in range(node.gpus)
    )
    return NodeInventory(NodeName(node.name), gpus, cpu_milli=node.cpu_milli, memory_mib=node.memory_mib)


def pod_request(pod: TracePod, serial: int) -> PodRequest:
    containers: tuple[ContainerRequest, ...] = ()
    if pod.num_gpu:
        if pod.gpu_milli >= MILLI:
            container = ContainerRequest("main", False, pod.num_gpu)
        else:
            pct = pod.gpu_milli // 10
            container = ContainerRequest("main", False, pod.num_gpu, memory_pct=pct, cores_pct=pct)
        containers = (container,)
    selection = Selection(use_types=tuple(t.lower() for t in pod.gpu_spec))
    return PodRequest("bench", f"{pod.name}-{serial}", containers, selection,
                      cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)


def typical_workload(pods: Iterable[TracePod]) -> TypicalWorkload:
    samples = ((p.cpu_milli, p.num_gpu, p.gpu_milli, tuple(t.lower() for t in p.gpu_spec)) for p in pods)
    return TypicalWorkload.from_samples(samples, coverage=0.95)


def arrivals(pods: Sequence[TracePod], seed: int, capacity_milli: int) -> list[TracePod]:
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    limit = ARRIVAL_LIMIT * capacity_milli
    requested = sum(p.gpu_milli_total for p in order)
    while True:
        extra = rng.choice(pods)
        if requested + extra.gpu_milli_total > limit:
            break
        order.append(extra)
        requested += extra.gpu_milli_total
    return order


@dataclass
class SeedResult:
    allocation_ratio: dict[str, float]
    fragmentation_ratio: float
    placed: int
    failed: int
    latencies_s: list[float] = field(default_factory=list)


class Cluster:
    """The simulated cluster: inventories, a Ledger, and per-node memo of plans by pod shape."""

    def __init__(self, nodes: Sequence[NodeInventory], policy: Policy, ctx: ScoringContext) -> None:
        self.nodes = list(nodes)
        self.policy = policy
        self.ctx = ctx
        self.ledger = Ledger()
        self.usages: list[NodeUsage] = [self.ledger.usage(n) for n in self.nodes]
        self.summaries = [summarize(n, u.loads) for n, u in zip(self.nodes, self.usages)]
        self.memo: list[dict] = [{} for _ in self.nodes]
        self.shared: dict[tuple, Plan | None] = {}
        self.request_ids: dict[tuple, int] = {}

    def request_id(self, request: PodRequest) -> int:
        """Pods with the same shape get one small int, so the per-node memo hashes cheaply."""
        key = (request.cpu_milli, request.memory_mib, request.gpu_key)
        return self.request_ids.setdefault(key, len(self.request_ids))

    def decide(self, request: PodRequest, rng: random.Random) -> int | None:
        shape = self.request_id(request)
        best_score = None
        best: list[int] = []
        for i, node in enumerate(self.nodes):
            memo = self.memo[i]
            plan = memo.get(shape, 0)
            if plan == 0:
                plan = self._plan(i, request, shape)
                memo[shape] = plan
            if plan is None:
                continue
            score = plan.score
            if best_score is None or score > best_score:
                best_score, best = score, [i]
            elif score == best_score:
                best.append(i)
        if not best:
            return None
        return best[0] if len(best) == 1 else rng.choice(best)

    def _plan(self, i: int, request: PodRequest, shape: int) -> Plan | None:
        if not may_fit(self.summaries[i], request):
            return None
        node, usage = self.nodes[i], self.usages[i]
        # Nodes of one shape in one state answer alike (no uuid filters in the trace).
        key = (node.shape, usage.loads, usage.cpu_milli, usage.memory_mib, shape)
        if key in self.shared:
            return self.shared[key]
        plan = plan_pod(node, usage, request, self.policy, self.ctx)
        result = plan if isinstance(plan, Plan) else None
        if len(self.shared) > 200_000:
            self.shared.clear()
        self.shared[key] = result
        return result

    def bind(self, i: int, request: PodRequest) -> None:
        node = self.nodes[i]
        plan = self.memo[i][self.request_id(request)]
        key = PodKey(f"{request.namespace}/{request.name}")
        if request.wants_gpus:
            record = record_from_plan(node, self.usages[i], request, plan)
            self.ledger.apply(record, key, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
        else:
            self.ledger.add_host(node.name, key, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
        self.usages[i] = self.ledger.usage(node)
        self.summaries[i] = summarize(node, self.usages[i].loads)
        self.memo[i].clear()

    def fragmentation_ratio(self, model: FragmentationModel) -> float:
        fragmented = free = 0.0
        for node, usage in zip(self.nodes, self.usages):
            fragmented += model.node_fragmentation(node, usage.loads, node.cpu_milli - usage.cpu_milli)
            free += sum(free_share_milli(s, l) for s, l in zip(node.gpus, usage.loads))
        return fragmented / free if free else 0.0


def run_seed(
    nodes: Sequence[NodeInventory], pods: Sequence[TracePod], policy: Policy, seed: int, model: FragmentationModel
) -> SeedResult:
    capacity = sum(len(n.gpus) for n in nodes) * MILLI
    ctx = scoring_context(nodes, model)
    cluster = Cluster(nodes, policy, ctx)
    tie_rng = random.Random(seed * 7919 + 1)
    arrived = allocated = placed = failed = 0
    ratios: dict[str, float] = {}
    frag_ratio = None
    latencies: list[float] = []
    for serial, pod in enumerate(arrivals(pods, seed, capacity)):
        request = pod_request(pod, serial)
        started = time.perf_counter()
        chosen = cluster.decide(request, tie_rng)
        if chosen is not None:
            cluster.bind(chosen, request)
        latencies.append(time.perf_counter() - started)
        arrived += pod.gpu_milli_total
        if chosen is None:
            failed += 1
        else:
            placed += 1
            allocated += pod.gpu_milli_total
        if frag_ratio is None and arrived >= FRAGMENTATION_POINT * capacity:
            frag_ratio = cluster.fragmentation_ratio(model)
        for point in READ_POINTS:
            label = str(round(point * 100))
            if label not in ratios and arrived >= point * capacity:
                ratios[label] = 100.0 * allocated / capacity
    for point in READ_POINTS:  # the 130 % point is reached by the last arrival at the latest
        ratios.setdefault(str(round(point * 100)), 100.0 * allocated / capacity)
    return SeedResult(ratios, 100.0 * (frag_ratio or 0.0), placed, failed, latencies)


def scoring_context(nodes: Sequence[NodeInventory], model: FragmentationModel) -> ScoringContext:
    return ScoringContext(
        fragmentation=model,
        cpu_norm_milli=max(n.cpu_milli for n in nodes),
        gpu_norm_milli=max(len(n.gpus) for n in nodes) * MILLI,
    )


def run_policy(nodes: Sequence[NodeInventory], pods: Sequence[TracePod], name: str, seeds: Sequence[int]) -> dict:
    model = FragmentationModel(typical_workload(pods))
    results = [run_seed(nodes, pods, POLICIES[name], seed, model) for seed in seeds]
    latencies = sorted(x for r in results for x in r.latencies_s)
    return {
        "allocation_ratio": {
            label: {
                "mean": round(statistics.fmean(r.allocation_ratio[label] for r in results), 3),
                "per_seed": [round(r.allocation_ratio[label], 3) for r in results],
            }
            for label in results[0].allocation_ratio
        },
        "fragmentation_ratio_80": round(statistics.fmean(r.fragmentation_ratio for r in results), 2),
        "placed": sum(r.placed for r in results),
        "failed": sum(r.failed for r in results),
        "latency_ms": {
            "p50": round(1000 * _quantile(latencies, 0.50), 3),
            "p99": round(1000 * _quantile(latencies, 0.99), 3),
            "max": round(1000 * latencies[-1], 3),
        },
    }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
