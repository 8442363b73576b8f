"""An AmdGpuPool's status, summed from its nodes' AmdGpuNode inventories and the
allocation records of the pods on them. Pure.

Conditions:
* Ready is True when the pool has at least one healthy GPU; otherwise False with
  NoNodes, NoGpusReported or NoHealthyGpus (or InvalidPool when it cannot own nodes).
* Degraded is True when something needs a look although the pool may work:
  UnhealthyGpus, NodesNotReporting (a member without an AmdGpuNode),
  UndecodableAllocations, EventsNotHandled (a watch event the operator's handlers have not
  taken yet: it is retried), DrainRequired (a member keeps its operating mode until its GPU pods
  are gone), NodeConflicts. The first reason in that order is the
  condition's reason; the message lists them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rocshare.api.models import AmdGpuPoolStatus
from rocshare_operator.feed.cluster_facts import GpuNodeFacts
from rocshare_operator.status.conditions import ConditionState, merge_conditions
from rocshare_operator.status.usage import GpuSummary, PodSlices


@dataclass(frozen=True)
class Inventory:
    """One node's AmdGpuNode, as the agent published it."""

    node: str
    gpus: tuple[GpuSummary, ...]

    @classmethod
    def of(cls, facts: GpuNodeFacts) -> Inventory:
        return cls(facts.name, facts.summaries())

    def cu_counts(self) -> dict[str, int]:
        return {gpu.id: gpu.cu_count for gpu in self.gpus}


@dataclass(frozen=True)
class PoolFacts:
    """Everything status is computed from, gathered by the caller."""

    generation: int | None
    members: Sequence[str]
    conflicting: Sequence[str]
    inventories: Mapping[str, Inventory]
    pods_by_node: Mapping[str, Sequence[PodSlices]]
    problem: str | None = None  # the pool cannot own nodes, and why
    draining: Sequence[str] = ()  # members that keep their operating mode until their GPU pods are gone
    events_failing: Sequence[str] = ()  # watch events the operator's handlers have not taken yet (retrying)


@dataclass(frozen=True)
class _Totals:
    gpus: int = 0
    healthy: int = 0
    vram_mib: int = 0
    allocated_mib: int = 0
    cores_pct: int = 0
    not_reporting: int = 0
    undecodable: int = 0


def pool_status(facts: PoolFacts, *, previous_conditions: Iterable[Mapping] | None, now: str) -> dict:
    """The status object to write (camelCase JSON, as AmdGpuPoolStatus)."""
    totals = _sum(facts)
    states = [_ready(facts, totals), _degraded(facts, totals)]
    status = AmdGpuPoolStatus(
        nodes=len(facts.members), gpus_total=totals.gpus, gpus_healthy=totals.healthy, vram_total_mib=totals.vram_mib,
        vram_allocated_mib=totals.allocated_mib, cores_allocated_pct=totals.cores_pct,
        conflicting_nodes=sorted(facts.conflicting), observed_generation=facts.generation,
    ).to_json_dict()
    status["conditions"] = merge_conditions(previous_conditions, states, generation=facts.generation, now=now)
    return status


def _sum(facts: PoolFacts) -> _Totals:
    gpus = healthy = vram = allocated = cores = not_reporting = undecodable = 0
    for node in facts.members:
        inventory = facts.inventories.get(node)
        if inventory is None:
            not_reporting += 1
        gpus_here = inventory.gpus if inventory else ()
        gpus += len(gpus_here)
        healthy += sum(1 for gpu in gpus_here if gpu.healthy)
        vram += sum(gpu.vram_mib or 0 for gpu in gpus_here)
        cu_counts = inventory.cu_counts() if inventory else {}
        for pod in facts.pods_by_node.get(node, ()):
            if pod.error:
                undecodable += 1
                continue
            held = pod.held(cu_counts)
            allocated += held.memory_mib
            cores += held.cores_pct
    return _Totals(gpus, healthy, vram, allocated, cores, not_reporting, undecodable)


def _ready(facts: PoolFacts, totals: _Totals) -> ConditionState:
    if facts.problem:
        return ConditionState("Ready", "False", "InvalidPool", facts.problem)
    if not facts.members:
        held = f"; {len(facts.conflicting)} selected node(s) held by older pools" if facts.conflicting else ""
        return ConditionState("Ready", "False", "NoNodes", f"no node is in the pool{held}")
    if totals.gpus == 0:
        return ConditionState("Ready", "False", "NoGpusReported",
                              f"{len(facts.members)} node(s), none has reported GPUs (is the node agent running?)")
    if totals.healthy == 0:
        return ConditionState("Ready", "False", "NoHealthyGpus", f"all {totals.gpus} GPU(s) are unhealthy")
    return ConditionState("Ready", "True", "GpusAvailable",
                          f"{totals.healthy} of {totals.gpus} GPU(s) healthy on {len(facts.members)} node(s)")


def _degraded(facts: PoolFacts, totals: _Totals) -> ConditionState:
    issues = []
    if totals.healthy < totals.gpus:
        issues.append(("UnhealthyGpus", f"{totals.gpus - totals.healthy} GPU(s) unhealthy"))
    if totals.not_reporting:
        issues.append(("NodesNotReporting", f"{totals.not_reporting} node(s) without an AmdGpuNode"))
    if totals.undecodable:
        issues.append(("UndecodableAllocations", f"{totals.undecodable} pod(s) whose allocation cannot be read"
                                                   " (their nodes take no new pods until they end)"))
    if facts.events_failing:
        issues.append(("EventsNotHandled", f"{len(facts.events_failing)} watch event(s) not handled yet, retrying: "
                                           + "; ".join(list(facts.events_failing)[:5])))
    if facts.draining:
        issues.append(("DrainRequired", f"{len(facts.draining)} node(s) hold GPU pods and switch operating mode "
                                        "once drained: " + ", ".join(list(facts.draining)[:10])))
    if facts.conflicting:
        issues.append(("NodeConflicts", f"{len(facts.conflicting)} selected node(s) held by older pools: "
                                        + ", ".join(sorted(facts.conflicting)[:10])))
    if not issues:
        return ConditionState("Degraded", "False", "AsExpected", "")
    return ConditionState("Degraded", "True", issues[0][0], "; ".join(message for _, message in issues))
