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

Each decision takes the best node of the pod shape's ``Ranking`` (ranking.py): plan_pod's
score for every node, kept current by re-planning only the nodes bound since that shape was
last placed, plans shared between nodes in the same state. Ties go to the first node in a
fixed per-seed order (the paper's simulator) or, with ``ties="random"``, to a random one
(stock kube-scheduler). Then the AllocationRecord is built and applied to a Ledger.
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
from rocshare_dev.bench.ranking import Ranking
from rocshare_dev.bench.trace import TraceNode, TracePod

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
ORDERED, RANDOM = "ordered", "random"
TIES = (ORDERED, RANDOM)


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
    cpu_latencies_s: list[float] = field(default_factory=list)
    """The same decisions in this thread's CPU time: what the decision costs, without the
    time other processes on a shared machine take the core away."""


class Cluster:
    """The simulated cluster: inventories, a Ledger, and one incremental ranking per pod shape."""

    def __init__(self, nodes: Sequence[NodeInventory], policy: Policy, ctx: ScoringContext) -> None:
        self.nodes = list(nodes)
        self.policy = policy
        self.ctx = ctx
        self.ledger = Ledger()
        self.usages: list[NodeUsage] = [self.ledger.usage(n) for n in self.nodes]
        self.summaries = [summarize(n, u.loads) for n, u in zip(self.nodes, self.usages)]
        self.state_ids: dict[tuple, int] = {}
        self.shape_ids: dict[tuple, int] = {}
        self.states = [self._state(i) for i in range(len(self.nodes))]
        self.versions = [0] * len(self.nodes)
        self.changes: list[int] = []
        self.rankings: dict[tuple, Ranking] = {}
        self.shared: dict[tuple, Plan | None] = {}

    def ranking(self, request: PodRequest) -> Ranking:
        """The ranking of the request's shape (what plan_pod reads of a trace pod)."""
        key = (request.cpu_milli, request.memory_mib, request.gpu_key)
        ranking = self.rankings.get(key)
        if ranking is None:
            shape = self.shape_ids.setdefault(key, len(self.shape_ids))
            ranking = self.rankings[key] = Ranking(len(self.nodes), lambda i: self._plan(i, request, shape))
        ranking.refresh(self.versions, self.changes)
        return ranking

    def decide(self, request: PodRequest, rng: random.Random | None) -> int | None:
        """The best-scoring node; ties: the first in node order (rng None) or at random."""
        ranking = self.ranking(request)
        if rng is None:
            top = ranking.top(self.versions)
            return None if top is None else top[1]
        best = ranking.ties_at_top(self.versions)
        return (best[0] if len(best) == 1 else rng.choice(best)) if best else None

    def _state(self, i: int) -> int:
        """A small int for everything plan_pod reads of node i: nodes of one shape in one state
        answer alike (the trace has no uuid filters), so plans are shared by state. Ints, so a
        lookup does not re-hash the nested load tuples."""
        usage = self.usages[i]
        state = (self.nodes[i].shape, usage.loads, usage.cpu_milli, usage.memory_mib)
        return self.state_ids.setdefault(state, len(self.state_ids))

    def _plan(self, i: int, request: PodRequest, shape: int) -> Plan | None:
        key = (self.states[i], shape)
        result = self.shared.get(key, 0)
        if result != 0:
            return result
        result = None
        if may_fit(self.summaries[i], request):
            plan = plan_pod(self.nodes[i], self.usages[i], request, self.policy, self.ctx)
            result = plan if isinstance(plan, Plan) else None
        self.shared[key] = result
        return result

    def bind(self, i: int, request: PodRequest, plan: Plan | None = None) -> None:
        """Commit the request on node i: the ranking's plan, or `plan` (the GPUs some other rule chose)."""
        node = self.nodes[i]
        plan = plan or self.ranking(request).plans[i]
        key = PodKey(f"{request.namespace}/{request.name}")
        if request.wants_gpus:
            record = record_from_plan(node, self.usages[i], request, plan)
            self.ledger.apply(record, key, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
        else:
            self.ledger.add_host(node.name, key, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib)
        self.usages[i] = self.ledger.usage(node)
        self.summaries[i] = summarize(node, self.usages[i].loads)
        self.states[i] = self._state(i)
        self.versions[i] += 1
        self.changes.append(i)

    def fragmentation_ratio(self, model: FragmentationModel) -> float:
        fragmented = free = 0.0
        for node, usage in zip(self.nodes, self.usages):
            fragmented += model.node_fragmentation(node, usage.loads, node.cpu_milli - usage.cpu_milli)
            free += sum(free_share_milli(s, l) for s, l in zip(node.gpus, usage.loads))
        return fragmented / free if free else 0.0


def run_seed(
    nodes: Sequence[NodeInventory],
    pods: Sequence[TracePod],
    policy: Policy,
    seed: int,
    model: FragmentationModel,
    ties: str = ORDERED,
) -> SeedResult:
    capacity = sum(len(n.gpus) for n in nodes) * MILLI
    ctx = scoring_context(nodes, model)
    cluster = Cluster(node_order(nodes, seed), policy, ctx)
    tie_rng = random.Random(seed * 7919 + 1) if ties == RANDOM else None
    arrived = allocated = placed = failed = 0
    ratios: dict[str, float] = {}
    frag_ratio = None
    latencies: list[float] = []
    cpu_latencies: list[float] = []
    for serial, pod in enumerate(arrivals(pods, seed, capacity)):
        request = pod_request(pod, serial)
        started, cpu_started = time.perf_counter(), time.thread_time()
        chosen = cluster.decide(request, tie_rng)
        if chosen is not None:
            cluster.bind(chosen, request)
        latencies.append(time.perf_counter() - started)
        cpu_latencies.append(time.thread_time() - cpu_started)
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
    return SeedResult(ratios, 100.0 * (frag_ratio or 0.0), placed, failed, latencies, cpu_latencies)


def node_order(nodes: Sequence[NodeInventory], seed: int) -> list[NodeInventory]:
    """The nodes in a fixed random order per seed. The paper's simulator prefixes node names
    with a random permutation and its kube-scheduler fork breaks score ties by the smallest
    name, so ties go to the first node in such an order; ``--ties random`` is stock kube-scheduler."""
    order = list(nodes)
    random.Random(seed).shuffle(order)
    return order


def scoring_context(nodes: Sequence[NodeInventory], model: FragmentationModel) -> ScoringContext:
    return ScoringContext(
        fragmentation=model,
        cpu_norm_milli=max(n.cpu_milli for n in nodes),
        gpu_norm_milli=max(len(n.gpus) for n in nodes) * MILLI,
    )


def run_policy(
    nodes: Sequence[NodeInventory], pods: Sequence[TracePod], name: str, seeds: Sequence[int], ties: str = ORDERED
) -> dict:
    model = FragmentationModel(typical_workload(pods))
    results = [run_seed(nodes, pods, POLICIES[name], seed, model, ties) for seed in seeds]
    latencies = sorted(x for r in results for x in r.latencies_s)
    cpu_latencies = sorted(x for r in results for x in r.cpu_latencies_s)
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
        "latency_ms": _percentiles(latencies),
        "cpu_latency_ms": _percentiles(cpu_latencies),
    }


def _percentiles(sorted_seconds: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(1000 * _quantile(sorted_seconds, 0.50), 3),
        "p99": round(1000 * _quantile(sorted_seconds, 0.99), 3),
        "max": round(1000 * sorted_seconds[-1], 3),
    }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
