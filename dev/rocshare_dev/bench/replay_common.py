"""What both modes of `rocshare-dev bench replay` share (replay.py runs them): the names of the
replay's objects, the trace pod as a user writes it, the node names, the outcome as arrivals
proceed, and the loop that submits the pods one at a time and reads each decision.

Extender mode (replay_cluster.py) and DRA mode (replay_dra.py) import this module and nothing of
each other; replay.py imports both and picks one (`--mode`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rocshare.kube.client import ApiError, Kube, Unavailable, object_path
from rocshare_dev.bench.trace import TraceNode, TracePod

POOL = "replay"
NAMESPACE = "replay"
SIM_LABEL = {"rocshare.io/sim": "replay"}
SCHEDULER = "rocshare-scheduler"
CU_COUNT = 100
REPLAY_BACKOFFS = {"podInitialBackoffSeconds": 60, "podMaxBackoffSeconds": 600}
"""kube-scheduler's retry backoffs in both modes (replay_cluster._scheduler_config says why)."""


@dataclass
class Outcome:
    """Allocation as arrivals proceed: the ratio read at 100 % and 130 %, and the curve."""

    capacity_milli: int
    arrived: int = 0
    allocated: int = 0
    placed: int = 0
    failed: int = 0
    ratios: dict[str, float] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)
    choices: list[str | None] = field(default_factory=list)
    """Per pod in sequence order: the trace node it went to, or None."""

    def add(self, pod: TracePod, node: str | None) -> None:
        placed = node is not None
        self.choices.append(node)
        self.arrived += pod.gpu_milli_total
        if placed:
            self.placed += 1
            self.allocated += pod.gpu_milli_total
        else:
            self.failed += 1
        arrived_pct = 100.0 * self.arrived / self.capacity_milli
        allocated_pct = 100.0 * self.allocated / self.capacity_milli
        self.curve.append((round(arrived_pct, 3), round(allocated_pct, 3)))
        for label in ("100", "130"):
            if label not in self.ratios and arrived_pct >= int(label):
                self.ratios[label] = allocated_pct

    def summary(self) -> dict[str, Any]:
        final = 100.0 * self.allocated / self.capacity_milli
        ratios = {label: round(self.ratios.get(label, final), 3) for label in ("100", "130")}
        return {"allocation_ratio": ratios, "placed": self.placed, "failed": self.failed, "curve": self.curve,
                "choices": self.choices}


def pod_object(pod: TracePod, serial: int) -> dict[str, Any]:
    """A trace pod as a user would write it (mapping in replay.py's docstring)."""
    limits: dict[str, str] = {}
    if pod.num_gpu:
        limits["amd.com/gpu"] = str(pod.num_gpu)
        if pod.gpu_milli < 1000:
            limits["amd.com/gpucores"] = limits["amd.com/gpumem-percentage"] = str(pod.gpu_milli // 10)
    resources: dict[str, Any] = {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}
    if limits:
        resources["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{serial:05d}", "namespace": NAMESPACE, "labels": {"trace-pod": pod.name[:63]}},
            "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "trace", "resources": resources}]}}


def node_classes(subset: Sequence[TraceNode]) -> list[tuple[tuple[int, int], list[TraceNode]]]:
    """The sample's nodes by (CPU milli, memory MiB), in order: a kubelet peer sets one capacity."""
    classes: dict[tuple[int, int], list[TraceNode]] = defaultdict(list)
    for node in subset:
        classes[(node.cpu_milli, node.memory_mib)].append(node)
    return sorted(classes.items())


def node_names(subset: Sequence[TraceNode]) -> dict[str, TraceNode]:
    """Cluster node name -> trace node: ``rp<class>-<n>``, the same in both modes of the replay."""
    return {f"rp{number:02d}-{index:04d}": node
            for number, (_, members) in enumerate(node_classes(subset)) for index, node in enumerate(members)}


class Fleet(Protocol):
    """What `submit` needs of a mode's nodes: the cluster name -> trace node map, and a check to
    run when a decision is late."""

    nodes: dict[str, TraceNode]

    def check_alive(self) -> None: ...


# ---- pods --------------------------------------------------------------------------------------


class _Decisions:
    """What the watch has shown of each pod: bound to a node, or unschedulable with a message."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}
        self.unschedulable: dict[str, str] = {}

    def see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            self.bound[name] = node
        else:
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                        and condition.get("reason") == "Unschedulable"):
                    self.unschedulable.setdefault(name, condition.get("message") or "")


async def submit(kube: Kube, fleet: Fleet, sequence: Sequence[TracePod], decision_timeout_s: float,
                  *, start: int = 0, pod_of: Callable[[TracePod, int], dict[str, Any]] = pod_object) -> dict[str, Any]:
    """The pods one at a time, each decision awaited; `fleet` is anything with the node map
    (`nodes`) and `check_alive()`; `pod_of` writes trace pod `serial` as the mode wants it."""
    capacity = sum(node.gpus for node in fleet.nodes.values()) * 1000
    outcome = Outcome(capacity)
    decisions = _Decisions()
    path = object_path("v1", "pods", namespace=NAMESPACE)
    if start:  # resuming: the decisions of pods created before
        for pod in (await kube.list(path)).get("items", []):
            decisions.see(pod)
        for serial in range(start):
            node = decisions.bound.get(f"p{serial:05d}")
            outcome.add(sequence[serial], fleet.nodes[node].name if node in fleet.nodes else None)
    latencies: list[float] = []
    started = time.monotonic()
    for serial in range(start, len(sequence)):
        pod = sequence[serial]
        body = pod_of(pod, serial)
        name = body["metadata"]["name"]
        begun = time.monotonic()
        await _create(kube, path, body)
        await _decided(kube, fleet, decisions, name, serial, decision_timeout_s)
        latencies.append(time.monotonic() - begun)
        node = decisions.bound.get(name)
        outcome.add(pod, fleet.nodes[node].name if node in fleet.nodes else None)
        if serial % 250 == 0:
            print(f"replay: {serial}/{len(sequence)} pods, {time.monotonic() - started:.0f} s, "
                  f"allocated {100.0 * outcome.allocated / capacity:.2f} %", file=sys.stderr, flush=True)
    replay_s = time.monotonic() - started
    await asyncio.sleep(5.0)  # late binds, if any, show up in the final list
    return {**outcome.summary(), **_final(sequence, await kube.list(path), decisions, capacity),
            "replay_s": round(replay_s, 1), "pods_per_s": round((len(sequence) - start) / replay_s, 1),
            "decision_ms": _percentiles(latencies)}


async def _decided(kube: Kube, fleet: Fleet, decisions: _Decisions, name: str, serial: int,
                   timeout_s: float) -> None:
    """Poll the pod until it is bound or Unschedulable. Not a namespace watch: once hundreds of
    pods wait, kube-scheduler rewrites their status on every retry, and a watch of the namespace
    falls minutes behind that stream."""
    path = object_path("v1", "pods", name, namespace=NAMESPACE)
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while time.monotonic() < deadline:
        try:
            decisions.see(await kube.get(path))
        except (ApiError, TimeoutError):
            pass
        if name in decisions.bound or name in decisions.unschedulable:
            return
        await asyncio.sleep(pause)
        pause = min(0.2, pause * 1.5)
    fleet.check_alive()
    raise RuntimeError(f"pod {name} (serial {serial}): no decision within {timeout_s:.0f} s")


async def _create(kube: Kube, path: str, body: dict[str, Any]) -> None:
    for attempt in range(5):
        try:
            await kube.create(path, body)
            return
        except Unavailable:
            await asyncio.sleep(1.0 + attempt)
        except ApiError as error:
            if getattr(error, "status", 0) == 409:  # created by an attempt whose answer was lost
                return
            raise


def _final(sequence: Sequence[TracePod], listed: dict[str, Any], decisions: _Decisions,
           capacity: int) -> dict[str, Any]:
    """The figure from a fresh list: GPU-milli of the pods bound by the end; why the rest wait."""
    by_name = {f"p{serial:05d}": pod for serial, pod in enumerate(sequence)}
    bound = {pod["metadata"]["name"] for pod in listed.get("items", []) if (pod.get("spec") or {}).get("nodeName")}
    allocated = sum(by_name[name].gpu_milli_total for name in bound if name in by_name)
    reasons: Counter[str] = Counter()
    for pod in listed.get("items", []):
        if pod["metadata"]["name"] not in bound:
            reasons[_reason(decisions.unschedulable.get(pod["metadata"]["name"], "no decision seen"))] += 1
    example = next((message for name, message in decisions.unschedulable.items() if name not in bound), None)
    return {"final_allocation_ratio": round(100.0 * allocated / capacity, 3), "bound_at_end": len(bound),
            "pending_at_end": len(sequence) - len(bound),
            "late_binds": len(bound & set(decisions.unschedulable)),
            "pending_reasons": dict(reasons.most_common(8)), "pending_example": example}


def _reason(message: str) -> str:
    """The kinds of reasons in kube-scheduler's message, counts left out: "0/304 nodes are
    available: 170 Insufficient cpu, 34 2/2 ExclusiveDeviceAllocateConflict, ... preemption: ..."
    -> "ExclusiveDeviceAllocateConflict, Insufficient cpu" (for a summary by kind)."""
    detail = message.split(": ", 1)[-1].split(". preemption:", 1)[0].split(". no new claims", 1)[0]
    kinds = set()
    for part in detail.replace(".", ",").split(","):
        words = [word for word in part.split() if not word[0].isdigit()]
        if words:
            kinds.add(" ".join(words))
    return ", ".join(sorted(kinds)) or message[:120]


def _percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(1000 * pick(0.5), 1), "p99": round(1000 * pick(0.99), 1), "max": round(1000 * ordered[-1], 1)}
