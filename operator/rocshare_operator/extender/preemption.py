"""Preemption that understands slices: the pods' priorities as the pod watch shows them, the
decision over a `Snapshot` (which lower-priority pods to evict on which node, by the core's
rule, rocshare.core.preemption), and the hold of nominated pods. Pure decisions; the side
effects (evictions, events, the nomination) are preemptor.py's.

Why the extender decides on its own as well as in kube-scheduler's preempt verb: kube-scheduler
calls an extender's `preemptVerb` only with the nodes its own dry run found victims on, using
its in-tree plugins alone. The shipped profile leaves every amd.com resource to the extender
(NodeResourcesFit ignores the group), so where only slices are short its dry run finds the pod
"fits" once its victims are reprieved, drops the node ("expected at least one victim pod") and
never calls the verb (pkg/scheduler/framework/preemption in 1.35). So:

* `preempt` (the verb) serves the nodes kube-scheduler does send (where CPU, memory or pods are
  short too): on each, its victims are taken as gone and the extender adds the fewest slice
  holders still needed; a node where no set makes the pod fit is dropped.
* When filter finds the pod fits no node, the leading extender chooses the victims itself,
  over every node the filter was asked about, evicts them as kube-scheduler would (a
  DisruptionTarget condition, then a delete) and nominates the pod (status.nominatedNodeName).

The hold (`nominated_holds`): a pod nominated to a node, not bound yet, of priority at least
the asking pod's, is counted there as if placed, planned against the node without the pods
being deleted there (its victims): a pod of lower priority arriving meanwhile cannot take the
room, and the nominated pod binds there when its victims are gone. The hold is derived from the
pods' own status.nominatedNodeName and priority as the pod watch shows them: nothing in a
replica's memory, so a new leader holds the same room.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from rocshare.core.allocate import PodPlanner, record_from_plan
from rocshare.core.fit import FitFailure
from rocshare.core.holdings import record_holding
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import NodeUsage, add_usage, hold_usage, usage_of
from rocshare.core.preemption import NoVictims, Occupant, PodTraits, Victims, choose_victims, usage_without
from rocshare.core.request import PodRequest
from rocshare_operator.feed.cluster_facts import PodFacts


@dataclass(frozen=True, slots=True)
class Nominee:
    key: PodKey
    priority: int
    request: PodRequest


@dataclass
class PodIndex:
    """What preemption reads of live pods, from the pod watch: each bound pod's traits (uid,
    priority, start), pods being deleted per node, and pods nominated to a node (unbound)."""

    traits: dict[PodKey, PodFacts] = field(default_factory=dict)
    deleting: dict[str, set[PodKey]] = field(default_factory=dict)
    nominated: dict[str, dict[PodKey, Nominee]] = field(default_factory=dict)
    _where: dict[PodKey, tuple[str, str]] = field(default_factory=dict)
    """Pod -> (its node, where it is nominated), to undo the last event's entries."""
    priorities: dict[int, int] = field(default_factory=dict)
    """Bound pods per priority: a pod no bound pod is below can preempt nobody (`may_preempt`)."""

    def may_preempt(self, priority: int) -> bool:
        """Some bound pod has a lower priority (a cheap test before any search)."""
        return any(value < priority for value in self.priorities)

    def on_pod(self, kind: str, pod: PodFacts) -> None:
        key = pod.key
        node, nominated = self._where.pop(key, ("", ""))
        old = self.traits.pop(key, None)
        if old is not None:
            left = self.priorities[old.priority] - 1
            if left:
                self.priorities[old.priority] = left
            else:
                del self.priorities[old.priority]
        if node:
            self._discard(self.deleting, node, key)
        if nominated:
            self._discard(self.nominated, nominated, key)
        if kind == "DELETED" or pod.finished:
            return
        if pod.node:
            self.traits[key] = pod
            self.priorities[pod.priority] = self.priorities.get(pod.priority, 0) + 1
            if pod.deleting:
                self.deleting.setdefault(pod.node, set()).add(key)
        elif pod.nominated and pod.request is not None and not pod.deleting:
            self.nominated.setdefault(pod.nominated, {})[key] = Nominee(key, pod.priority, pod.request)
        self._where[key] = (pod.node if pod.node and pod.deleting else "",
                            pod.nominated if not pod.node and pod.nominated and pod.request is not None else "")

    @staticmethod
    def _discard(table: dict, node: str, key: PodKey) -> None:
        found = table.get(node)
        if found is not None:
            (found.discard if isinstance(found, set) else lambda k: found.pop(k, None))(key)
            if not found:
                del table[node]

    def nominees(self, node: str, priority: int, asking: PodKey) -> list[Nominee]:
        """The pods nominated to the node that hold room against a pod of `priority` (at least as high)."""
        found = self.nominated.get(node)
        if not found:
            return []
        return sorted((n for n in found.values() if n.key != asking and n.priority >= priority),
                      key=lambda n: (-n.priority, n.key))

    def pod_traits(self, now: dt.datetime, protected: frozenset[PodKey] = frozenset()) -> Mapping[str, PodTraits]:
        """`PodTraits` of every bound pod (running time as of `now`), `protected` ones marked as
        violating a PodDisruptionBudget if evicted."""
        return _TraitsView(self.traits, now, protected)


class _TraitsView(Mapping):
    """PodTraits made on demand: a node's occupants are a handful of the cluster's pods."""

    def __init__(self, facts: Mapping[PodKey, PodFacts], now: dt.datetime, protected: frozenset[PodKey]) -> None:
        self._facts, self._now, self._protected = facts, now, protected

    def __getitem__(self, key: str) -> PodTraits:
        pod = self._facts[key]  # type: ignore[index]
        return PodTraits(pod.uid, pod.priority, running_seconds(pod.started_at, self._now), key in self._protected)

    def __iter__(self):
        return iter(self._facts)

    def __len__(self) -> int:
        return len(self._facts)


def pod_priority(pod: Mapping) -> int:
    """spec.priority of a pod object (0 when absent, as kube-scheduler reads it)."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def running_seconds(started_at: str, now: dt.datetime) -> float:
    if not started_at:
        return 0.0
    try:
        started = dt.datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (now - started).total_seconds())


def held_usage(node: NodeInventory, usage: NodeUsage, nominees: list[Nominee], planner_of,
               occupants: list[Occupant], deleting: set[PodKey]) -> NodeUsage:
    """The node's usage with each nominee's slices added where it would be placed once the pods
    being deleted there are gone (highest priority first, each on top of the ones before).
    `planner_of(request)`: the node's planner for that pod. A nominee that would not fit even
    then holds nothing (kube-scheduler will nominate it elsewhere or clear the nomination)."""
    if not nominees:
        return usage
    gone = [o for o in occupants if o.key in deleting]
    free = usage_without(node, usage, occupants, gone)
    gpus = list(usage.gpus)
    for nominee in nominees:
        plan = planner_of(nominee.request).plan(node, free)
        if isinstance(plan, FitFailure):
            continue
        record = record_from_plan(node, free, nominee.request, plan)
        placed = list(free.gpus)
        for hold in record_holding(record).gpus:
            pos = node.position_of(hold.gpu_id)
            if pos is not None:
                gpus[pos] = add_usage(gpus[pos], hold_usage(hold))
                placed[pos] = add_usage(placed[pos], hold_usage(hold))
        free = usage_of(node, tuple(placed), free.cpu_milli, free.memory_mib)
    return usage_of(node, tuple(gpus), usage.cpu_milli, usage.memory_mib)


def victims_on(node: NodeInventory, usage: NodeUsage, occupants: list[Occupant], planner: PodPlanner,
               priority: int, already: frozenset[str] = frozenset(), better_than=None) -> Victims | NoVictims:
    """The core's choice on one node, with the pods whose uid is in `already` (kube-scheduler's own
    victims) taken as gone first: the extra victims needed, possibly none."""
    gone = [o for o in occupants if o.uid and o.uid in already]
    if gone:
        usage = usage_without(node, usage, occupants, gone)
        occupants = [o for o in occupants if o not in gone]
        fits = planner.plan(node, usage)
        if not isinstance(fits, FitFailure):
            return Victims(node.name, (), fits, 0, 0, 0, 0)
    return choose_victims(node, usage, occupants, planner, priority, better_than)

