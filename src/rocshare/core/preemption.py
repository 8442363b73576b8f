"""Which pods to evict from a node so that a higher-priority pod fits there. Pure.

The preemptor's WHOLE request must fit once the victims' slices are freed, by the one fit rule
(rocshare.core.allocate's planner: disjoint CUs, memory, the slice and GPU counts, partitions
whole, init containers and sidecars counted as rocshare.core.holdings counts them). Nothing here
works out a fit of its own: a set of victims is tried by planning the preemptor against the node's
usage without them.

The victims are chosen among the node's *occupants* (every pod, or HAMi-placed pod, holding
slices or host resources there): only those of strictly lower priority, and only those holding
something on a GPU the preemptor could use (a GPU barred to it -- unhealthy, of a filtered type or
uuid, offered under another resource -- frees nothing it can take). Of the sets that make the pod
fit, the cheapest, in this order (kube-scheduler's own order first, DESIGN.md section 11):

1. fewest PodDisruptionBudget violations;
2. the lowest highest priority among the victims, then fewest victims of that priority;
3. fewest victims;
4. least GPU time lost: each victim's slice (the larger of its memory and compute share of each
   GPU it holds, in thousandths of a GPU) times how long it has run.

Every cheaper set is tried before a dearer one, and a subset always costs less than its superset,
so the set returned is minimal: no victim in it could be spared. Up to `EXACT_LIMIT` useful
candidates are searched exhaustively; above it, kube-scheduler's way: every candidate removed,
then each reprieved in turn (the most costly to lose first) while the pod still fits -- also
minimal, not always the cheapest. A node where the pod does not fit even with every candidate
gone is not a candidate (`NoVictims` says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from rocshare.core.allocate import Plan, PodPlanner
from rocshare.core.fit import FitFailure
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.ledger import EMPTY_GPU, GpuUsage, Ledger, NodeUsage, add_usage, clipped, usage_of

EXACT_LIMIT = 10
"""Useful candidates up to which every set is tried in cost order (at most 1,023 sets)."""


@dataclass(frozen=True, slots=True)
class Occupant:
    """One pod holding something on the node, as the preemption decision reads it."""

    key: str
    uid: str
    priority: int | None
    """None: not a pod the scheduler may evict (a DRA claim, a pod not read yet): never a victim."""
    gpus: tuple[tuple[int, GpuUsage], ...] = ()
    """(GPU position on the node, what the pod holds of it) for each GPU it holds."""
    cpu_milli: int = 0
    memory_mib: int = 0
    running_s: float = 0.0
    """How long it has run (0 while not started)."""
    violates_pdb: bool = False
    """Evicting it would violate a PodDisruptionBudget (kube-scheduler's rule, worked out by the caller)."""


@dataclass(frozen=True, slots=True)
class Victims:
    """The cheapest set found on one node, and the preemptor's plan once they are gone."""

    node: str
    pods: tuple[Occupant, ...]
    plan: Plan
    pdb_violations: int
    top_priority: int
    at_top: int
    gpu_milli_s: int
    """GPU time lost, in thousandths of a GPU times seconds."""

    @property
    def cost(self) -> tuple[int, int, int, int, int]:
        return (self.pdb_violations, self.top_priority, self.at_top, len(self.pods), self.gpu_milli_s)


@dataclass(frozen=True, slots=True)
class NoVictims:
    """Why no set of lower-priority pods on the node makes room: ``reason`` is a word of
    rocshare.api.reasons; ``fit`` the planner's reasons with every candidate gone, if it was asked."""

    node: str
    reason: str
    fit: FitFailure | None = None


NO_LOWER_PRIORITY = "NoLowerPriorityPods"
"""No pod of lower priority holds anything on a GPU the preemptor could use."""
NOT_ENOUGH_EVEN_EMPTIED = "PreemptionWouldNotFit"
"""Even with every lower-priority pod gone, the pod does not fit the node."""


def share_milli(spec: GpuSpec, usage: GpuUsage) -> int:
    """How much of the GPU a hold takes, in thousandths: the larger of its memory and CU shares."""
    if usage.whole:
        return 1000
    memory = usage.memory_mib * 1000 // spec.memory_mib if spec.memory_mib else 0
    cores = usage.cu_held * 1000 // spec.cu_count if spec.cu_count else 0
    return min(1000, max(memory, cores))


def gpu_milli_s(node: NodeInventory, occupant: Occupant) -> int:
    share = sum(share_milli(node.gpus[pos], usage) for pos, usage in occupant.gpus if pos < len(node.gpus))
    return int(share * occupant.running_s)


def usage_without(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant],
                  gone: Iterable[Occupant]) -> NodeUsage:
    """The node's usage once `gone` have left: each GPU they held recomputed from the occupants
    that stay (the ledger's own rule: memory and slices summed, CU masks joined)."""
    gone_keys = {occupant.key for occupant in gone}
    if not gone_keys:
        return usage
    touched = {pos for occupant in occupants if occupant.key in gone_keys for pos, _ in occupant.gpus}
    gpus = list(usage.gpus)
    for pos in touched:
        total = EMPTY_GPU
        for occupant in occupants:
            if occupant.key in gone_keys:
                continue
            for where, held in occupant.gpus:
                if where == pos:
                    total = add_usage(total, held)
        gpus[pos] = clipped(total, node.gpus[pos].cu_count)
    cpu = sum(o.cpu_milli for o in occupants if o.key in gone_keys)
    memory = sum(o.memory_mib for o in occupants if o.key in gone_keys)
    return usage_of(node, tuple(gpus), max(0, usage.cpu_milli - cpu), max(0, usage.memory_mib - memory))


def useful_candidates(node: NodeInventory, planner: PodPlanner, occupants: Sequence[Occupant],
                      priority: int) -> list[Occupant]:
    """Occupants of strictly lower priority holding something on a GPU the preemptor could use
    (the planner's own verdict on which GPUs no load changes: barred or offered under another
    resource to every one of its containers)."""
    fits, barred = planner.shape_facts(node)
    usable = {pos for pos in range(len(node.gpus))
              if barred[pos] is None and any(fit.unoffered[pos] is None for fit in fits)}
    return [occupant for occupant in occupants
            if occupant.priority is not None and occupant.priority < priority
            and any(pos in usable for pos, _ in occupant.gpus)]


Cost = tuple[int, int, int, int, int]
"""(PDB violations, top priority, victims of that priority, victims, GPU time lost): smaller is cheaper."""


def _cost(node: NodeInventory, pods: Sequence[Occupant], lost: Mapping[str, int] | None = None) -> Cost:
    top = max(p.priority or 0 for p in pods)
    return (sum(p.violates_pdb for p in pods), top, sum(1 for p in pods if p.priority == top), len(pods),
            sum(lost[p.key] if lost is not None else gpu_milli_s(node, p) for p in pods))


def lower_bound(node: NodeInventory, planner: PodPlanner, occupants: Sequence[Occupant], priority: int) -> Cost | None:
    """No set of victims on the node costs less than this (None: no candidate at all). Planning-free,
    so a caller after the cheapest node only searches nodes that could beat the best found so far."""
    candidates = useful_candidates(node, planner, occupants, priority)
    if not candidates:
        return None
    pdb = 0 if not all(p.violates_pdb for p in candidates) else 1
    lowest = min(p.priority or 0 for p in candidates if p.violates_pdb == bool(pdb))
    cheapest = min(gpu_milli_s(node, p) for p in candidates if p.violates_pdb == bool(pdb) and p.priority == lowest)
    # A single victim of the lowest priority is the cheapest any set can be; its GPU time is at least
    # that of the cheapest such candidate (a set with more victims costs more at the 4th place).
    return (pdb, lowest, 1, 1, cheapest)


DEARER = "Dearer"
"""`choose_victims` with `better_than`: no set on the node is cheaper than that (not a reason users see)."""


def choose_victims(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant], planner: PodPlanner,
                   priority: int, better_than: Cost | None = None) -> Victims | NoVictims:
    """The cheapest set of lower-priority occupants whose going lets the planner's pod fit the node
    (module docstring), or why none does. `occupants`: every pod holding something on the node
    (those never to be evicted included: `usage_without` recomputes GPUs from who stays).

    `better_than` (a caller after the cheapest node, holding a set of this cost elsewhere): when it is
    one victim without a PDB violation, only sets that can beat it are searched -- single victims of
    its priority that lost less GPU time, and sets of lower priority only -- and `NoVictims(DEARER)`
    says none does."""
    candidates = useful_candidates(node, planner, occupants, priority)
    if not candidates:
        return NoVictims(node.name, NO_LOWER_PRIORITY)
    if better_than is not None and better_than[0] == 0 and better_than[2:4] == (1, 1):
        return _beating_one(node, usage, occupants, planner, candidates, better_than)
    return _search(node, usage, occupants, planner, candidates)


def _beating_one(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant], planner: PodPlanner,
                 candidates: list[Occupant], best: Cost) -> Victims | NoVictims:
    top, lost = best[1], best[4]
    lower = [p for p in candidates if not p.violates_pdb and (p.priority or 0) < top]
    if lower:
        found = _search(node, usage, occupants, planner, lower)
        if isinstance(found, Victims):
            return found  # its top priority is below `top`: cheaper than any single victim of `top`
    singles = sorted((p for p in candidates if not p.violates_pdb and p.priority == top
                      and gpu_milli_s(node, p) < lost), key=lambda p: (gpu_milli_s(node, p), p.key))
    for pod in singles:
        plan = planner.plan(node, usage_without(node, usage, occupants, (pod,)))
        if not isinstance(plan, FitFailure):
            return _victims(node, (pod,), plan)
    return NoVictims(node.name, DEARER)


def _search(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant], planner: PodPlanner,
            candidates: list[Occupant]) -> Victims | NoVictims:
    emptied = planner.plan(node, usage_without(node, usage, occupants, candidates))
    if isinstance(emptied, FitFailure):
        return NoVictims(node.name, NOT_ENOUGH_EVEN_EMPTIED, emptied)
    reprieved = _reprieved(node, usage, occupants, planner, candidates, emptied)
    if len(candidates) <= EXACT_LIMIT and len(reprieved.pods) > 1:
        return _cheapest(node, usage, occupants, planner, candidates, reprieved)
    return reprieved


def _victims(node: NodeInventory, pods: Sequence[Occupant], plan: Plan) -> Victims:
    pdb, top, at_top, _count, lost = _cost(node, pods)
    ordered = tuple(sorted(pods, key=lambda p: (-(p.priority or 0), p.key)))
    return Victims(node.name, ordered, plan, pdb, top, at_top, lost)


def _cheapest(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant], planner: PodPlanner,
              candidates: list[Occupant], known: Victims) -> Victims:
    """Every set of candidates cheaper than `known` (a minimal set that fits), cheapest first (the pod
    keys break ties, so the answer does not depend on the order the occupants came in); the first
    that fits, else `known`. Only sets no larger than `known` can be cheaper."""
    lost = {p.key: gpu_milli_s(node, p) for p in candidates}
    ceiling = (known.cost, sorted(p.key for p in known.pods))
    sets = []
    for size in range(1, len(known.pods) + 1):
        for chosen in combinations(candidates, size):
            key = (_cost(node, chosen, lost), sorted(p.key for p in chosen))
            if key < ceiling:
                sets.append((key, chosen))
    sets.sort(key=lambda item: item[0])
    for _key, chosen in sets:
        plan = planner.plan(node, usage_without(node, usage, occupants, chosen))
        if not isinstance(plan, FitFailure):
            return _victims(node, chosen, plan)
    return known


def _reprieved(node: NodeInventory, usage: NodeUsage, occupants: Sequence[Occupant], planner: PodPlanner,
               candidates: list[Occupant], plan: Plan) -> Victims:
    """Every candidate gone, then each spared in turn, the dearest to lose first (PDB-protected,
    higher priority, longer GPU time), while the pod still fits."""
    ordered = sorted(candidates, key=lambda p: (not p.violates_pdb, -(p.priority or 0),
                                                -gpu_milli_s(node, p), p.key))
    victims = list(ordered)
    for pod in ordered:
        trial = [p for p in victims if p.key != pod.key]
        if not trial:
            break
        replanned = planner.plan(node, usage_without(node, usage, occupants, trial))
        if not isinstance(replanned, FitFailure):
            victims, plan = trial, replanned
    return _victims(node, victims, plan)


def best_node(found: Iterable[Victims]) -> Victims | None:
    """The node whose victims cost least (the node name breaks ties, for a stable answer)."""
    return min(found, key=lambda victims: (victims.cost, victims.node), default=None)


@dataclass(frozen=True, slots=True)
class PodTraits:
    """What the ledger does not know of a pod and the choice reads."""

    uid: str
    priority: int
    running_s: float = 0.0
    violates_pdb: bool = False


def occupants_of(ledger: Ledger, node: NodeInventory, traits: Mapping[str, PodTraits]) -> list[Occupant]:
    """Every pod the ledger counts on the node's GPUs, with its traits; one without traits (a DRA
    claim, a pod whose object is not known) is kept as an occupant that is never a victim."""
    found = []
    for key, gpus in sorted(ledger.holders(node).items()):
        cpu, memory = ledger.host_of(key)
        trait = traits.get(key)
        found.append(Occupant(key, trait.uid if trait else "", trait.priority if trait else None, tuple(gpus),
                              cpu, memory, trait.running_s if trait else 0.0, bool(trait and trait.violates_pdb)))
    return found


# ---- PodDisruptionBudgets ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """A PodDisruptionBudget as the choice reads it: its namespace, selector, disruptions allowed."""

    namespace: str
    match_labels: tuple[tuple[str, str], ...]
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...]
    """(key, operator, values): In, NotIn, Exists, DoesNotExist."""
    allowed: int

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def selects(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(key) != value for key, value in self.match_labels):
            return False
        for key, operator, values in self.match_expressions:
            present = key in labels
            ok = {"In": present and labels.get(key) in values, "NotIn": not present or labels.get(key) not in values,
                  "Exists": present, "DoesNotExist": not present}.get(operator, False)
            if not ok:
                return False
        return True


def budget_of(pdb: Mapping) -> Budget:
    """A policy/v1 PodDisruptionBudget object as a `Budget` (an unknown operator selects nothing)."""
    selector = (pdb.get("spec") or {}).get("selector") or {}
    expressions = tuple((str(e.get("key", "")), str(e.get("operator", "")), tuple(map(str, e.get("values") or ())))
                        for e in selector.get("matchExpressions") or ())
    return Budget(str((pdb.get("metadata") or {}).get("namespace", "")),
                  tuple(sorted((str(k), str(v)) for k, v in (selector.get("matchLabels") or {}).items())),
                  expressions, int((pdb.get("status") or {}).get("disruptionsAllowed") or 0))


def pdb_protected(pods: Iterable[tuple[str, str, Mapping[str, str]]], budgets: Sequence[Budget]) -> frozenset[str]:
    """The pods (key, namespace, labels) whose eviction would violate a budget, kube-scheduler's
    rule: a budget with an empty selector selects nothing; each pod it selects uses one of its
    allowed disruptions, in the order given, and a pod past the last one violates it."""
    left = [budget.allowed for budget in budgets]
    protected = set()
    for key, namespace, labels in pods:
        for index, budget in enumerate(budgets):
            if budget.namespace != namespace or budget.empty or not budget.selects(labels):
                continue
            left[index] -= 1
            if left[index] < 0:
                protected.add(key)
    return frozenset(protected)
