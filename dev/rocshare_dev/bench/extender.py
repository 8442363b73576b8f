"""`rocshare-dev bench extender`: the extender's decision latency for one pod at cluster scale.

A `SchedulerState` is built in memory through the same handlers the informers call
(on_pool, on_node, on_gpu_node) for N nodes of 8 real GPUs each (see fleet.py: MI210 and
MI300X captures, synthetic VRAM), then filled to a target occupancy with records the core
allocator made, committed with `state.commit` as bind does. Each timed round is one pod:

1. filter over the **full** node list (kube-scheduler sends every node that passed its own
   filters: the profile's percentageOfNodesToScore is 100), keeping the nodes the policy ranks
   best (`decisions.best_nodes`, what the server answers), the reply rendered as JSON-ready dicts;
2. the bind decision on one of them: exactly what `Binder` does except its HTTP calls (parse the
   pod, node_rejection, allocate, encode the record and the HAMi annotation).
The shipped profile calls no prioritize (filter's reply is already the best nodes): it is not timed.

The pod is then committed and an earlier bench pod released, outside the timing, so
occupancy stays put while nodes change under the caches as they would in a live cluster.
Pods are drawn from fleet.POD_MIX, so shapes repeat as in a real workload: "warm" rounds
follow one untimed pod of each shape (a live extender's steady state); "cold" rounds empty
the extender's plan memo first, as for the first pod of a never-seen shape.
Only the decision functions are timed: no HTTP and no JSON parsing of the request body.
Between rounds, as the live extender does in the time between kube-scheduler's calls, the plan
refresher (refresh.py) plans each recently asked shape's changed nodes; its CPU per pod is
reported apart (`refresh_cpu_*`), and `--no-refresh` measures the decisions without it (every
decision then plans what changed since its shape was last asked about).
The pool's gpuPolicy is `--gpu-policy` (default fragmentation-aware, the recommended one: its
fragmentation model is on, learnt from the bench's pods as the pod feed would deliver them, and
looked at again every 50 binds during the timed rounds too; a replaced model scores the nodes planned after it).
The garbage collector is set as in the live extender (`heap.settle_heap` once the caches
are built), so its pauses are the ones production sees. Every collection during the timed rounds
is reported (`gc`): per generation, its longest pause, and how many landed inside a timed
decision. A collection between decisions (the refresher's turn) is not in any decision's figure,
but a request arriving during it waits: its longest pause is that wait.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import json
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

NODE_COUNTS = (100, 1000, 5000)
OCCUPANCIES = (0.5, 0.9)
TARGET_P99_MS = {1000: 5.0, 5000: 25.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=",".join(map(str, NODE_COUNTS)),
                        help="node counts, comma-separated (default: %(default)s)")
    parser.add_argument("--occupancy", default=",".join(map(str, OCCUPANCIES)),
                        help="fill levels, comma-separated fractions (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="timed pods per setting (default: 2000 at 100 nodes, 1000 at 1,000, 400 at 5,000)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gpu-policy", default="fragmentation-aware",
                        help="the pool's gpuPolicy (default: %(default)s, whose fragmentation model is on)")
    parser.add_argument("--no-refresh", action="store_true",
                        help="no plan refresher between rounds (decisions plan all their shape's changed nodes)")
    parser.add_argument("--preemptions", type=int, default=0,
                        help="also time this many preemption decisions per setting (a top-priority pod, every "
                             "node asked, every pod in the ledger a candidate; default: none)")
    parser.add_argument("--json", action="store_true", help="print the JSON report (default: a table)")


def run(args: argparse.Namespace) -> int:
    report = measure([int(n) for n in args.nodes.split(",")], [float(o) for o in args.occupancy.split(",")],
                     rounds=args.rounds, seed=args.seed, progress=not args.json, gpu_policy=args.gpu_policy,
                     refresh=not args.no_refresh, preemptions=args.preemptions)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def measure(node_counts: Sequence[int], occupancies: Sequence[float], *, rounds: int = 0, seed: int = 7,
            progress: bool = False, gpu_policy: str = "fragmentation-aware", refresh: bool = True,
            preemptions: int = 0) -> dict:
    results = []
    for nodes in node_counts:
        for occupancy in occupancies:
            result = asyncio.run(_measure_one(nodes, occupancy, rounds or _default_rounds(nodes), seed, gpu_policy,
                                              refresh, preemptions))
            results.append(result)
            if progress:
                print(_row(result), flush=True)
    return {"node_gpus": 8, "full_node_list": True, "gpu_policy": gpu_policy, "refresher": refresh,
            "settings": results}


def _default_rounds(nodes: int) -> int:
    return 2000 if nodes <= 100 else 1000 if nodes <= 1000 else 400


# ---- one setting -----------------------------------------------------------------------------


class GcPauses:
    """Every garbage collection while installed (gc.callbacks): (start, end, generation)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *_exc) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((self._started, time.perf_counter(), info["generation"]))

    def summary(self, **decisions: Sequence[tuple[float, float]]) -> dict:
        """Counts and longest pause per generation; per named set of timed decisions (warm, cold),
        the collections that fell inside one of them and the longest of those."""
        summary = {
            "collections": {str(gen): sum(1 for p in self.pauses if p[2] == gen) for gen in (0, 1, 2)},
            "longest_pause_ms": {str(gen): round(1000 * max((p[1] - p[0] for p in self.pauses if p[2] == gen),
                                                            default=0.0), 3) for gen in (0, 1, 2)},
        }
        for name, spans in decisions.items():
            ordered = sorted(spans)
            inside = [pause for pause in self.pauses if _overlaps(pause, ordered)]
            summary[f"in_{name}_decisions"] = len(inside)
            summary[f"longest_in_{name}_decisions_ms"] = round(1000 * max((p[1] - p[0] for p in inside), default=0.0), 3)
        return summary


def _overlaps(pause: tuple[float, float, int], spans: Sequence[tuple[float, float]]) -> bool:
    at = bisect.bisect_right(spans, (pause[0], float("inf"))) - 1
    return at >= 0 and spans[at][1] > pause[0] or at + 1 < len(spans) and spans[at + 1][0] < pause[1]


@dataclass
class Timings:
    cpu_s: list[float]
    total_s: list[float]
    filter_s: list[float]
    bind_s: list[float]
    feasible: list[int]
    """How many nodes filter kept (the best ones)."""
    refresh_cpu_s: list[float]
    spans: list[tuple[float, float]]
    """(start, end) of each timed decision, perf_counter seconds."""


async def _measure_one(nodes: int, occupancy: float, rounds: int, seed: int,
                       gpu_policy: str = "fragmentation-aware", refresh: bool = True, preemptions: int = 0) -> dict:
    from rocshare_operator.extender.heap import settle_heap
    from rocshare_operator.extender.refresh import Refresher
    from rocshare_operator.extender.state import SchedulerState

    rng = random.Random(seed)
    build_started = time.perf_counter()
    state = SchedulerState()
    names = build_nodes(state, nodes, gpu_policy)
    live = fill(state, names, occupancy, rng)
    build_s = time.perf_counter() - build_started
    reached = occupancy_of(state)
    settle_heap()  # as the live extender does once its caches are synced
    try:
        warm_up(state, names)
        refresher = Refresher(state) if refresh else None
        with GcPauses() as pauses:
            warm = await _rounds(state, names, live, rounds, rng, cold=False, refresher=refresher)
            cold = await _rounds(state, names, live, max(20, rounds // 10), rng, cold=True, refresher=refresher)
        preempt = preemption_rounds(state, names, live, preemptions, rng) if preemptions else None
    finally:
        gc.unfreeze()  # this setting's caches become garbage; the next one settles its own
    return {
        "nodes": nodes, "target_occupancy": occupancy, "occupancy": round(reached, 3),
        "pods_in_ledger": len(state.ledger), "rounds": rounds, "build_s": round(build_s, 1),
        "warm": _summary(warm), "cold": _summary(cold), "gc": pauses.summary(warm=warm.spans, cold=cold.spans),
        **({"preemption": preempt} if preempt else {}),
    }


def preemption_rounds(state, names: list[str], live: deque, rounds: int, rng: random.Random) -> dict:
    """The extender's preemption decision (decisions.preemption, as the preemptor calls it: cheapest only) for a pod
    of the top priority over every node, every pod in the ledger of one of two lower priorities with
    a running time up to a day: the victims chosen on each node, the cheapest node picked."""
    from rocshare_dev.bench.fleet import draw_pods, pod_object
    from rocshare.core.holdings import placement_request
    from rocshare.core.preemption import PodTraits
    from rocshare_operator.extender.decisions import preemption

    traits = {key: PodTraits(f"uid-{key}", rng.choice((100, 1000)), rng.uniform(60, 86_400)) for key in live}
    pods = draw_pods(rng, "preempt")
    total_s, found = [], []
    for _ in range(rounds):
        pod = next(pods)
        request = placement_request(pod_object(pod.name, pod.resources))
        started = time.perf_counter()
        choice = preemption(state.snapshot(), request, 10_000, names, traits, cheapest_only=True)
        best = choice.best
        total_s.append(time.perf_counter() - started)
        found.append(len(best.pods) if best is not None else -1)
    return {"rounds": rounds, "p50_ms": _ms(total_s, 0.5), "p99_ms": _ms(total_s, 0.99), "max_ms": _ms(total_s, 1.0),
            "victims_median": int(_quantile(found, 0.5))}


def build_nodes(state, count: int, gpu_policy: str = "fragmentation-aware") -> list[str]:
    from rocshare_dev.bench.fleet import gpu_node_object, node_kind, node_name, node_object, pool_object

    state.on_pool("ADDED", pool_object({"gpuPolicy": gpu_policy}))
    names = [node_name(i) for i in range(count)]
    for i, name in enumerate(names):
        state.on_node("ADDED", node_object(name, node_kind(i)))
        state.on_gpu_node("ADDED", gpu_node_object(name, node_kind(i)))
    return names


def fill(state, names: Sequence[str], occupancy: float, rng: random.Random) -> deque:
    """Fill each node towards its own target (uniform around `occupancy`, so nodes differ)."""
    from rocshare_dev.bench.fleet import NAMESPACE, draw_pods, held_share
    from rocshare.core.allocate import Plan, plan_pod, record_from_plan
    from rocshare.core.ids import pod_key
    from rocshare_operator.extender.decisions import policy_for

    pods = draw_pods(rng, "fill")
    live: deque = deque()
    low = max(0.0, 2 * occupancy - 1)
    for name in names:
        node = state.inventories[name]
        target, misses = rng.uniform(low, 1.0), 0
        while misses < 6:
            pod, usage = next(pods), state.ledger.usage(node)
            plan = plan_pod(node, usage, pod.request, policy_for(state.snapshot(), name, pod.request))
            if not isinstance(plan, Plan) or held_share(plan.loads_after, node.gpus) > target + 0.02:
                misses += 1
                continue
            key = pod_key(NAMESPACE, pod.name)
            record = record_from_plan(node, usage, pod.request, plan)
            state.commit(key, NAMESPACE, record, _host(pod.request))
            feed_workload(state, pod.name, record, _host(pod.request))
            live.append(key)
    rng.shuffle(live)
    return live


def _host(request):
    from rocshare.core.holdings import HostRequest

    return HostRequest(request.cpu_milli, request.memory_mib)


def feed_workload(state, name: str, record, host=None) -> None:
    """What the pod feed tells the pool's workload model of a bound pod (outside the timing)."""
    from rocshare.core.holdings import NO_HOST_REQUEST
    from rocshare.api.allocation import encode_record
    from rocshare_dev.bench.fleet import NAMESPACE
    from rocshare_operator.feed.cluster_facts import PodFacts

    state.workloads.on_pod("ADDED", PodFacts(namespace=NAMESPACE, name=name, node=record.node,
                                             scheduler_name="rocshare-scheduler", phase="Running", deleting=False,
                                             unschedulable=None, started=True, allocation=encode_record(record),
                                             host=host or NO_HOST_REQUEST))


def occupancy_of(state) -> float:
    from rocshare_dev.bench.fleet import held_share

    shares = [held_share(state.ledger.usage(node).loads, node.gpus) for node in state.inventories.values()]
    return sum(shares) / len(shares)


async def _rounds(state, names: list[str], live: deque, rounds: int, rng: random.Random, *, cold: bool,
                  refresher=None) -> Timings:
    from rocshare_dev.bench.fleet import NAMESPACE, draw_pods, pod_object
    from rocshare.core.ids import pod_key

    timings = Timings([], [], [], [], [], [], [])
    pods = draw_pods(rng, "cold" if cold else "warm")
    for _ in range(rounds):
        pod = next(pods)
        body = pod_object(pod.name, pod.resources)
        body["metadata"].update(resourceVersion="1", uid=f"uid-{pod.name}")  # as bind reads it
        if cold:
            state_caches_cleared(state)
        record = decide(state, body, names, timings)
        if record is not None:  # steady occupancy: this pod stays, an older one ends
            key = pod_key(NAMESPACE, pod.name)
            state.commit(key, NAMESPACE, record, _host(pod.request))
            feed_workload(state, pod.name, record, _host(pod.request))
            live.append(key)
            old = live.popleft()
            await state.on_pod("DELETED", {"metadata": {"namespace": NAMESPACE, "name": old.partition("/")[2]}})
        if refresher is not None:  # the time between kube-scheduler's calls
            cpu_started = time.thread_time()
            await refresher.catch_up()
            timings.refresh_cpu_s.append(time.thread_time() - cpu_started)
    return timings


def warm_up(state, names: list[str]) -> None:
    """One untimed filter per pod shape of the mix: the steady state of a live extender
    (whose modules, the binder's too, were all imported at start: no timed round pays an import)."""
    from rocshare_dev.bench.fleet import POD_MIX, pod_object
    from rocshare.core.holdings import placement_request
    from rocshare_operator.extender import binder  # noqa: F401
    from rocshare_operator.extender.decisions import best_nodes

    for serial, (_, resources) in enumerate(POD_MIX):
        request = placement_request(pod_object(f"warm-up-{serial}", resources))
        best_nodes(state.snapshot(), request, names)


def state_caches_cleared(state) -> None:
    memo = getattr(state, "plans", None)
    if memo is not None:
        memo.clear()


def decide(state, body: dict, names: list[str], timings: Timings):
    """One pod through filter (which keeps the best nodes) and the bind decision, each timed
    (kube-scheduler's own pick among filter's nodes, between the two, is not the extender's work:
    not timed; the bench takes the first)."""
    from rocshare.core.holdings import placement_request
    from rocshare_operator.extender.decisions import best_nodes

    cpu_started = time.thread_time()
    started = time.perf_counter()
    result = best_nodes(state.snapshot(), placement_request(body), names)  # as the server reads it
    result.to_json()
    filtered = time.perf_counter()
    cpu_filtered = time.thread_time()
    best = result.feasible[0] if result.feasible else None
    cpu_bind = time.thread_time()
    bind_started = time.perf_counter()
    record = _bind_decision(state, body, best) if best else None
    done = time.perf_counter()
    timings.cpu_s.append(cpu_filtered - cpu_started + time.thread_time() - cpu_bind)
    timings.total_s.append(filtered - started + done - bind_started)
    timings.filter_s.append(filtered - started)
    timings.bind_s.append(done - bind_started)
    timings.feasible.append(len(result.feasible))
    timings.spans.extend(((started, filtered), (bind_started, done)))
    return record


def _bind_decision(state, body: dict, best: str):
    from rocshare_operator.extender import binder

    # The Binder's own decision code, so the figure is bind's; it needs no client for this part.
    bind = binder.Binder(kube=None, state=state)
    record = bind._decide(body, best)
    binder._binding(body, best, binder._record_annotations(body, record, bind._device_types(best)))
    return record


# ---- report ----------------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: Sequence[float], q: float) -> float:
    return round(1000 * _quantile(values, q), 3)


def _summary(t: Timings) -> dict:
    return {
        "p50_ms": _ms(t.total_s, 0.5), "p99_ms": _ms(t.total_s, 0.99), "max_ms": _ms(t.total_s, 1.0),
        "cpu_p50_ms": _ms(t.cpu_s, 0.5), "cpu_p99_ms": _ms(t.cpu_s, 0.99),
        "filter_p50_ms": _ms(t.filter_s, 0.5), "filter_p99_ms": _ms(t.filter_s, 0.99),
        "bind_p50_ms": _ms(t.bind_s, 0.5), "bind_p99_ms": _ms(t.bind_s, 0.99),
        "best_nodes_median": int(_quantile(t.feasible, 0.5)), "rounds": len(t.total_s),
        **({"refresh_cpu_mean_ms": round(1000 * sum(t.refresh_cpu_s) / len(t.refresh_cpu_s), 3),
            "refresh_cpu_p99_ms": _ms(t.refresh_cpu_s, 0.99)} if t.refresh_cpu_s else {}),
    }


def _row(result: dict) -> str:
    warm, cold = result["warm"], result["cold"]
    return (f"{result['nodes']:5d} nodes  occupancy {result['occupancy']:.2f}  "
            f"p50 {warm['p50_ms']:7.2f} ms  p99 {warm['p99_ms']:7.2f} ms  "
            f"(filter {warm['filter_p99_ms']:.2f}, "
            f"bind {warm['bind_p99_ms']:.2f}; CPU p99 {warm['cpu_p99_ms']:.2f})  cold p99 {cold['p99_ms']:7.2f} ms  "
            f"best nodes {warm['best_nodes_median']}  built in {result['build_s']} s"
            + (f"  refresher CPU {warm['refresh_cpu_mean_ms']:.2f} ms/pod" if "refresh_cpu_mean_ms" in warm else "")
            + f"  GC: {result['gc']['in_warm_decisions']} collections in warm decisions (longest "
              f"{result['gc']['longest_in_warm_decisions_ms']:.1f} ms), longest full {result['gc']['longest_pause_ms']['2']:.1f} ms"
            + (f"  preemption p50 {result['preemption']['p50_ms']:.1f} ms p99 {result['preemption']['p99_ms']:.1f} ms "
               f"({result['preemption']['rounds']} decisions, median victims {result['preemption']['victims_median']})"
               if "preemption" in result else ""))
