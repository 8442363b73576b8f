"""Filter and prioritize over a `Snapshot` of the scheduler's state (the decision pass; the
replies they return are replies.py's). Not pure: a decision fills the plan cache (plans.py, the
memo below) as it goes; it writes nothing else.

Nothing here writes to the API server or reserves: kube-scheduler may drop a pod between filter and
bind, and a reservation made here would leak (DESIGN.md section 2, rule 1).
Rejections stay typed (reason words with GPU counts) until the reply is rendered
as the extender API's `"<n>/<total> <Reason>"` strings.

Speed (kube-scheduler may send thousands of node names per call): the core planner's
answer for a node -- its score, or why the pod does not fit -- is memoised in the plan cache
(plans.py, which owns the rule for when an answer is still valid), keyed by what the answer
depends on (the pod's GPU and host request and the node's policy). Each key's answers are two
tables, node -> score and node -> rejection, kept valid through the ledger's change journal: a
decision plans only the nodes changed since its key was last asked about (the refresher,
refresh.py, plans those between decisions for recently asked keys) and reads the rest with
one pass over the names per table. Prioritize, which kube-scheduler calls right after filter
for the same pod, and later pods of the same shape find the answers there. Answers for pods
that name no GPU uuid depend only on the node's shape and usage, and are also shared between
nodes alike. Per call, what is the same for every node is worked out once: the policy of each
pool (usually one for all), one `PodPlanner` per policy (it works out each node shape's
needs once), one `Rejection` per distinct failure (rendered once). When a decision must plan
many nodes (`BULK_MIN_NODES`; the first pod of a never-seen shape plans them all) and the
request's form allows, the core's bulk planner (rocshare.core.bulk) plans them at once on
arrays; its answers are `PodPlanner.plan`'s, bit for bit, and go into the memo as one by one. Quota, blocked nodes
and pools are read fresh on every call. The memo holds answers, not capacity: bind
(`bind_decision`) always plans again against the current
ledger, under its per-node lock.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress

from rocshare.api.models import Scheduling
from rocshare.api.allocation import AllocationRecord
from rocshare.core.allocate import DEFAULT_CONTEXT, Plan, PodPlanner, record_from_plan
from rocshare.core.bulk import BulkPlanner, handles
from rocshare.core.fit import FitFailure, Reason
from rocshare.core.ids import pod_key
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import NodeUsage
from rocshare.core.quota import limited
from rocshare.core.preemption import DEARER, NO_LOWER_PRIORITY, NoVictims, Occupant, PodTraits, Victims, best_node, lower_bound, occupants_of
from rocshare.core.policies import Policy, ScoringContext, score_levels
from rocshare.core.request import PodRequest
from rocshare_operator.extender.plans import KeyMemo
from rocshare_operator.extender.preemption import held_usage, victims_on
from rocshare_operator.extender.quota import quota_verdict
from rocshare_operator.extender.replies import FilterResult, Priorities, Rejection
from rocshare_operator.extender.state import Snapshot
from rocshare_operator.extender.workloads import reads_model

NO_INVENTORY = "NoGpuInventory"
"""The node has no published GPUs, no allocatable amd.com/gpu, its device plugin is not watched by the
kubelet (AmdGpuNode condition DevicePlugin False), or it is in no pool."""
UNREADABLE = "NodeUnreadable"
"""The node's Node, its AmdGpuNode or its pool settings cannot be read (or the AmdGpuNode lists a GPU
twice): it offers nothing until they can, and the reply says why."""
BLOCKED = "UndecodableAllocationRecord"
"""A pod on the node cannot be accounted for (its record or object cannot be read): its GPUs stay blocked."""
BULK_MIN_NODES = 16
"""Nodes to plan from which a decision plans them in bulk (rocshare.core.bulk), where the request's
form allows. Its fixed cost is some hundred array operations, ~0.5 ms; measured on the bench fleet
(fragmentation-aware, 2026-12-02): 16 nodes 0.52 ms in bulk vs 0.68 ms one by one, 48: 0.66 vs 1.21,
128: 0.89 vs 2.95. Below it, one by one (the refresher's few changed nodes)."""


def policy_for(snap: Snapshot, node_name: str, request: PodRequest) -> Policy:
    pool = snap.pool_of(node_name)
    return Policy.resolve(pool.scheduling if pool else Scheduling(), request)


@dataclass(frozen=True, slots=True)
class _Way:
    """How one pod is planned under one policy: the core's planner, its bulk planner where the
    request's form allows one, and, unless bind is asking (it always plans afresh), the memo of
    this (request, policy)."""

    planner: PodPlanner
    memo: KeyMemo | None
    bulk: BulkPlanner | None = None


class _Pass:
    """One decision call for one pod: what is the same for every node is worked out once
    (quota, policies per pool, the planner), so the per-node step is a few dict lookups."""

    def __init__(self, snap: Snapshot, request: PodRequest, *, memoised: bool = True, priority: int = 0) -> None:
        self.snap = snap
        self.request = request
        self.priority = priority
        """The pod's priority: pods nominated to a node with at least this priority hold room there."""
        self._key = pod_key(request.namespace, request.name)
        self.memoised = memoised
        self._inventories, self._node_pools, self._ledger = snap.inventories, snap.node_pools, snap.ledger
        self._blocked = snap.blocked
        selection = request.selection
        self._shareable = not (selection.use_uuids or selection.nouse_uuids)  # else answers read GPU ids
        self.host_only = not request.wants_gpus
        """A pod asking no GPU: any node may take it (kube-scheduler fits its CPU and memory too); where
        the extender knows the node, the policy scores it and its host resources are checked."""
        self.limits = snap.quota_limits(request.namespace)
        self.quota_free = self.host_only or not limited(self.limits)
        self.used = snap.quota_used(request.namespace)
        self.unaccountable = [] if self.quota_free else snap.unaccountable_in(request.namespace)
        self._request_key = (request.gpu_key, request.cpu_milli, request.memory_mib)
        self._ways: dict[tuple[Policy, ScoringContext], _Way] = {}
        self._pool_ways: dict[str | None, _Way] = {}
        self._quota: dict[object, str | None] = {}
        self._whole_node: dict[tuple[str, int, str], Rejection] = {}
        self._rejections: dict[FitFailure, Rejection] = {}
        self._uniform = self._uniform_way()

    def rejection(self, name: str) -> Rejection | None:
        """Why the pod cannot go to this node now, or None when it can."""
        node = self._inventories.get(name)
        if node is None or not node.gpus:
            return None if self.host_only else self.no_inventory(name)
        first = self.whole_node_rejection(name, node)
        if first is not None:
            return first
        answer = self.answer(name, node)
        return answer if isinstance(answer, Rejection) else None

    def whole_node_rejection(self, name: str, node: NodeInventory) -> Rejection | None:
        """What rejects the whole node before the planner is asked: a blocked node, the quota."""
        if self._blocked and name in self._blocked and not self.host_only:
            return self._whole(BLOCKED, len(node.gpus))
        if not self.quota_free:
            over = self._quota_verdict(node)
            if over is not None:
                return self._whole(Reason.RESOURCE_QUOTA_NOT_FIT.value, len(node.gpus), over)
        return None

    def whole_node_rejections(self, names: list[str]) -> dict[str, Rejection]:
        """`whole_node_rejection` of each listed node with GPUs (none at all in the usual case:
        no blocked node, no quota on the namespace)."""
        if self.quota_free and not (self._blocked and not self.host_only):
            return {}
        found: dict[str, Rejection] = {}
        for name in names:
            node = self._inventories.get(name)
            if node is not None and node.gpus:
                first = self.whole_node_rejection(name, node)
                if first is not None:
                    found[name] = first
        return found

    def answer(self, name: str, node: NodeInventory) -> float | Rejection:
        """The core planner's verdict for the node: the score, or the typed reasons it does not fit."""
        way = self.way_of(name)
        memo = way.memo
        if memo is None:
            return self._plan(node, way)
        found = memo.fits.get(name)
        if found is None:
            found = memo.misfits.get(name)
            if found is None:
                found = self._plan(node, way)
                memo.store(name, found)
        return found

    def answers(self, names: list[str]) -> tuple[Mapping[str, float], Mapping[str, Rejection]]:
        """The planner's verdict for every listed node with GPUs: scores where the pod fits, the
        reasons where it does not (the mappings may hold other nodes too: read them by name).
        With one way for every node, those are the memo's own tables: only nodes changed since
        this shape's last decision are planned, and the rest is read in bulk."""
        way = self._uniform
        inventories = self._inventories
        if way is None or way.memo is None:
            fits: dict[str, float] = {}
            misfits: dict[str, Rejection] = {}
            for name in names:
                node = inventories.get(name)
                if node is not None and node.gpus:
                    answer = self.answer(name, node)
                    if isinstance(answer, Rejection):
                        misfits[name] = answer
                    else:
                        fits[name] = answer
            return fits, misfits
        memo = way.memo
        known_fits, known_misfits = memo.fits, memo.misfits
        unknown = [name for name in names if name not in known_fits and name not in known_misfits]
        if way.bulk is not None and len(unknown) >= BULK_MIN_NODES:
            self._plan_in_bulk(unknown, way)
            return known_fits, known_misfits
        for name in unknown:
            node = inventories.get(name)
            if node is not None and node.gpus:
                memo.store(name, self._plan(node, way))
        return known_fits, known_misfits

    def _plan_in_bulk(self, names: list[str], way: _Way) -> None:
        """Plan the listed nodes with GPUs at once and store the answers in the memo: the same
        answers `_plan` would store one by one (the bulk planner's are `PodPlanner.plan`'s)."""
        nodes = list(map(self._inventories.get, names))
        if not all(node is not None and node.gpus for node in nodes):
            kept = [node is not None and bool(node.gpus) for node in nodes]
            names, nodes = list(compress(names, kept)), list(compress(nodes, kept))
        found = way.bulk.plan(self.snap.fleet, names, nodes, self._ledger, self._inventories)
        rejections = [self._verdict(failure) for failure in found.failures]
        way.memo.store_all(zip(found.fit_names, found.scores),
                           zip(found.misfit_names, map(rejections.__getitem__, found.failure_ids)))

    def _plan(self, node: NodeInventory, way: _Way) -> float | Rejection:
        usage = self._ledger.usage(node)
        if way.memo is None or not self._shareable:
            return self._verdict(way.planner.plan(node, usage))
        shape_key = (node.shape, usage.loads, usage.cpu_milli, usage.memory_mib)
        answer = way.memo.by_shape.get(shape_key)
        if answer is None:
            answer = self._verdict(way.planner.plan(node, usage))
            self.snap.plans.share(way.memo, shape_key, answer)
        return answer

    def _verdict(self, plan: Plan | FitFailure) -> float | Rejection:
        if not isinstance(plan, FitFailure):
            return plan.score
        found = self._rejections.get(plan)  # many nodes fail alike: one Rejection, rendered once
        if found is None:
            found = self._rejections[plan] = Rejection.of_fit(plan)
        return found

    def _uniform_way(self) -> _Way | None:
        """The one way every node is planned, when every pool resolves to the same policy
        (the usual case: then no node's pool needs looking up)."""
        pools = self.snap.pools
        ways = {self._way_key(Policy.resolve(pool.scheduling, self.request), name) for name, pool in pools.items()}
        if self.snap.some_node_of_no_known_pool():
            ways.add(self._way_key(Policy.resolve(Scheduling(), self.request), None))
        return self._way(*ways.pop()) if len(ways) == 1 else None

    def way_of(self, name: str) -> _Way:
        """How the node is planned: the one way of every node, or its pool's."""
        return self._uniform or self._way_of(name)

    def _way_of(self, name: str) -> _Way:
        pool = self._node_pools.get(name)
        found = self._pool_ways.get(pool)
        if found is None:
            found = self._pool_ways[pool] = self._way(*self._way_key(policy_for(self.snap, name, self.request), pool))
        return found

    def _way_key(self, policy: Policy, pool: str | None) -> tuple[Policy, ScoringContext, str | None]:
        """The policy, what it scores with (the pool's fragmentation model where it reads one), and
        whose model that is. The memo is keyed by the pool, not the model: when a pool's model is
        replaced, answers cached for a node stay until the node changes (then it is planned with the
        new one), so a model update costs no full re-plan of every node in one decision."""
        if not reads_model(policy):
            return policy, DEFAULT_CONTEXT, None
        return policy, self.snap.workloads.context(pool), pool or ""

    def _way(self, policy: Policy, ctx: ScoringContext, model_of: str | None) -> _Way:
        found = self._ways.get((policy, ctx))
        if found is None:
            memo = self.snap.plans.answers((self._request_key, policy, model_of), self._ledger, self.request) \
                if self.memoised else None
            planner = PodPlanner(self.request, policy, ctx)
            bulk = BulkPlanner(planner) if memo is not None and handles(self.request, policy) else None
            found = self._ways[(policy, ctx)] = _Way(planner, memo, bulk)
        return found

    # ---- the hold of nominated pods (preemption.py) -----------------------------------------

    def held_nodes(self, names: list[str]) -> list[str]:
        """The listed nodes where a pod nominated there holds room against this one."""
        nominated = self.snap.pods.nominated
        if not nominated:
            return []
        wanted = set(names)
        return [name for name in nominated if name in wanted and self.snap.pods.nominees(name, self.priority, self._key)]

    def held(self, name: str, node: NodeInventory, usage: NodeUsage) -> NodeUsage:
        """The node's usage with the room held by the pods nominated there (at least this pod's priority)."""
        pods = self.snap.pods
        nominees = pods.nominees(name, self.priority, self._key)
        if not nominees:
            return usage
        occupants = occupants_of(self._ledger, node, {})
        return held_usage(node, usage, nominees, lambda request: PodPlanner(request, policy_for(self.snap, name, request)),
                          occupants, pods.deleting.get(name, set()))

    def held_answer(self, name: str) -> float | Rejection | None:
        """The planner's verdict on a held node, planned afresh (not memoised: the hold is not in
        the ledger); None when the node has no GPUs."""
        node = self._inventories.get(name)
        if node is None or not node.gpus:
            return None
        usage = self.held(name, node, self._ledger.usage(node))
        return self._verdict(self.way_of(name).planner.plan(node, usage))

    def no_inventory(self, name: str) -> Rejection:
        """Why a node without GPUs on offer offers none: it cannot be read, or has none."""
        problem = self.snap.unreadable.get(name)
        return self._whole(NO_INVENTORY, 0) if problem is None else self._whole(UNREADABLE, 0, problem)

    def _whole(self, reason: str, total: int, detail: str = "") -> Rejection:
        key = (reason, total, detail)
        found = self._whole_node.get(key)
        if found is None:
            found = self._whole_node[key] = Rejection.whole_node(reason, total, detail)
        return found

    def _quota_verdict(self, node: NodeInventory) -> str | None:
        # The verdict reads only the node's largest GPU memory and omittedCores: both in its shape.
        if node.shape not in self._quota:
            self._quota[node.shape] = quota_verdict(self.request, node, self.limits, self.used, self.unaccountable)
        return self._quota[node.shape]


def node_rejection(snap: Snapshot, request: PodRequest, name: str) -> Rejection | None:
    """Why the pod cannot go to this node now, or None when it can -- planned afresh (bind's check)."""
    return _Pass(snap, request, memoised=False).rejection(name)


def bind_decision(snap: Snapshot, request: PodRequest, name: str, priority: int = 0) -> AllocationRecord | Rejection:
    """Bind's choice on the node, planned afresh against the ledger as it is now: the record to
    commit, or why the pod no longer fits there. One plan does both, by the planner filter ranked
    the node with (the pool's policy and, where it reads one, its fragmentation model), so the GPUs
    bind takes are the ones the node's score assumed."""
    decision = _Pass(snap, request, memoised=False, priority=priority)
    node = snap.inventories.get(name)
    if node is None or not node.gpus:
        return decision.no_inventory(name)
    first = decision.whole_node_rejection(name, node)
    if first is not None:
        return first
    usage = decision.held(name, node, snap.ledger.usage(node))
    plan = decision.way_of(name).planner.plan(node, usage)
    return Rejection.of_fit(plan) if isinstance(plan, FitFailure) else record_from_plan(node, usage, request, plan)


def refresh(snap: Snapshot, memo: KeyMemo) -> int:
    """Plan now the nodes the ledger changed since the key's last look -- exactly what the key's
    next decision would plan (refresh.py does this between decisions). Returns how many."""
    changed = snap.ledger.changed_since(memo.synced) if memo.request is not None else None
    if not changed:
        return 0  # nothing changed, or the journal dropped it: the next decision plans afresh
    names = list(dict.fromkeys(changed))
    _Pass(snap, memo.request).answers(names)
    return len(names)


def filter_nodes(snap: Snapshot, request: PodRequest, node_names: list[str], priority: int = 0) -> FilterResult:
    return _filtered(_Pass(snap, request, priority=priority), node_names)[0]


def _filtered(decision: _Pass, node_names: list[str]) -> tuple[FilterResult, Mapping[str, float], Mapping[str, Rejection]]:
    """Which listed nodes the pod fits and why the others not; with the planner's tables, which
    prioritize reads again for the feasible nodes."""
    fits, misfits = decision.answers(node_names)
    held = decision.held_nodes(node_names)
    if held:  # rare: copies of the listed answers (never the memo's own tables), the held nodes replanned
        fits = {name: fits[name] for name in node_names if name in fits}
        misfits = {name: misfits[name] for name in node_names if name in misfits}
        for name in held:
            answer = decision.held_answer(name)
            fits.pop(name, None)
            misfits.pop(name, None)
            if isinstance(answer, Rejection):
                misfits[name] = answer
            elif answer is not None:
                fits[name] = answer
    feasible = [name for name in node_names if name in fits]
    failed = {name: misfits[name] for name in node_names if name in misfits}
    if len(feasible) + len(failed) < len(node_names):  # nodes without GPUs, or none the extender knows
        no_gpus = {name for name in node_names if name not in fits and name not in misfits}
        if decision.host_only:
            feasible = [name for name in node_names if name in fits or name in no_gpus]
        else:
            failed.update({name: decision.no_inventory(name) for name in no_gpus})
    first = decision.whole_node_rejections(feasible + list(failed))
    if first:
        feasible = [name for name in feasible if name not in first]
        failed.update(first)
    return FilterResult(feasible, failed), fits, misfits


def best_nodes(snap: Snapshot, request: PodRequest, node_names: list[str],
               queued: Mapping[str, int] | None = None, priority: int = 0) -> FilterResult:
    """filter's reply: of the nodes the pod fits, only those prioritize would rank best -- the
    highest 0-10 level over every feasible node, less one level per bind under way there (`queued`,
    below 0 too: see below).

    kube-scheduler adds its own score plugins (0-100 each) to the extender's level times 10 times its
    weight; with the weight the profile used (1000) one level outweighed every plugin together, so
    the plugins only ever broke ties inside the top level. Handing kube-scheduler that top level
    alone keeps its pick (the same nodes, the same tie-breaks; only where binds under way would have
    been clamped at 0 does it differ, on purpose, see below), while it scores a handful of nodes
    instead of every feasible one and needs no prioritize call at all (the profile names none:
    manifests/base/scheduler). The nodes left out fit: they are not FailedNodes, and the
    pod's status never names them (kube-scheduler reports failures only when no node is left)."""
    decision = _Pass(snap, request, priority=priority)
    result, fits, misfits = _filtered(decision, node_names)
    feasible = result.feasible
    if len(feasible) < 2:
        return result
    levels = _levels(decision, fits, misfits, feasible)
    if queued:
        # Not clamped at 0 as prioritize's scores must be: in a burst every node may have binds
        # queued, and clamped they would all tie at 0, so kube-scheduler's own scores would pick --
        # MostAllocated, which counts the pods it has sent to bind: the very node with the most
        # binds waiting, over and over, until it is full and every further bind there fails.
        levels = [level - queued[name] if name in queued else level for name, level in zip(feasible, levels)]
    top = max(levels)
    return FilterResult([name for name, level in zip(feasible, levels) if level == top], result.failed)


def prioritize(snap: Snapshot, request: PodRequest, node_names: list[str]) -> Priorities:
    decision = _Pass(snap, request)
    fits, misfits = decision.answers(node_names)
    return Priorities(node_names, _levels(decision, fits, misfits, node_names))


def prioritize_dra(snap: Snapshot, request: PodRequest, node_names: list[str]) -> Priorities:
    """`prioritize` for a DRA pod over `snap` = the nodes of pools serving DRA (state.dra_snapshot):
    the same planner, fragmentation model, hold index and levels; planned afresh (the plan cache
    follows the extender's own nodes). Only a score: kube-scheduler's DRA allocator decides the fit."""
    decision = _Pass(snap, request, memoised=False)
    fits, misfits = decision.answers(node_names)
    return Priorities(node_names, _levels(decision, fits, misfits, node_names))


def _levels(decision: _Pass, fits: Mapping[str, float], misfits: Mapping[str, Rejection],
            node_names: list[str]) -> list[int]:
    """Each listed node's 0-10 level: the planner's raw scores scaled over these nodes (0 where the
    pod does not fit)."""
    raw = list(map(fits.get, node_names))  # None where the pod does not fit (or no GPUs)
    scored = set(raw)
    scored.discard(None)
    if decision.host_only and scored:
        # A node without GPUs strands none: for a pod asking no GPU it is as good as the best GPU
        # node (kube-scheduler's MostAllocated breaks that tie).
        best = max(scored)
        raw = [best if score is None and name not in misfits else score for name, score in zip(node_names, raw)]
    level: dict[float | None, int] = score_levels(scored)
    level[None] = 0
    return list(map(level.__getitem__, raw))


# ---- preemption (preemption.py) ------------------------------------------------------------------


CANDIDATES_MIN_ABSOLUTE = 100
CANDIDATES_MIN_PERCENT = 10
"""kube-scheduler's DefaultPreemption defaults (minCandidateNodesAbsolute, minCandidateNodesPercentage):
its dry run stops after this many candidate nodes, and so does the extender's own search."""


def candidates_wanted(nodes: int) -> int:
    return max(CANDIDATES_MIN_ABSOLUTE, nodes * CANDIDATES_MIN_PERCENT // 100)


@dataclass(frozen=True, slots=True)
class PreemptionChoice:
    """Per node asked about: the victims that make room (possibly only kube-scheduler's own), or why
    none do; `quota`: the pod is over its namespace's quota, so no node is a candidate."""

    found: dict[str, Victims]
    refused: dict[str, str]
    quota: str | None = None

    @property
    def best(self) -> Victims | None:
        return best_node(self.found.values())


def preemption(snap: Snapshot, request: PodRequest, priority: int, node_names: list[str],
               traits: Mapping[str, PodTraits], given: Mapping[str, frozenset[str]] | None = None,
               cheapest_only: bool = False) -> PreemptionChoice:
    """Which lower-priority pods to evict on each listed node so that the pod fits there
    (rocshare.core.preemption's rule), with the room held by pods nominated there at least as
    high counted (they keep it), and the pods being deleted there, and, where kube-scheduler
    sent its own victims (`given`: node -> uids), those, taken as gone first. A node that is
    blocked, has no GPUs, or where no set works is refused, with the reason.

    `cheapest_only` (the extender's own preemption, which evicts on one node): as kube-scheduler's
    dry run does, nodes are searched from an offset (here the pod's own, stable across retries) and
    the search stops once `candidates_wanted(len(node_names))` nodes with candidates were looked at
    (those with victims, and those that could not beat the best); a node whose
    lower bound (rocshare.core.preemption.lower_bound) is no cheaper than the best set found so far is
    not searched (it is in neither table)."""
    decision = _Pass(snap, request, memoised=False, priority=priority)
    found: dict[str, Victims] = {}
    refused: dict[str, str] = {}
    names = node_names
    wanted = len(names)
    if cheapest_only and names:
        start = zlib.crc32(f"{request.namespace}/{request.name}".encode()) % len(names)
        names = names[start:] + names[:start]
        wanted = candidates_wanted(len(names))
    best: tuple | None = None
    dearer = 0  # nodes with candidates whose bound could not beat the best: looked at, like `found`
    for name in names:
        if len(found) + dearer >= wanted:
            break
        node = snap.inventories.get(name)
        if node is None or not node.gpus:
            refused[name] = decision.no_inventory(name).reasons[0][0]
            continue
        first = decision.whole_node_rejection(name, node)
        if first is not None:
            if first.reasons[0][0] == Reason.RESOURCE_QUOTA_NOT_FIT.value:
                return PreemptionChoice({}, {}, first.text())
            refused[name] = first.reasons[0][0]
            continue
        occupants = occupants_of(snap.ledger, node, traits)
        planner = decision.way_of(name).planner
        if cheapest_only and best is not None:
            bound = lower_bound(node, planner, occupants, priority)
            if bound is None:
                refused[name] = NO_LOWER_PRIORITY
                continue
            if bound >= best:
                dearer += 1
                continue
        usage = decision.held(name, node, snap.ledger.usage(node))
        going = {occupant.uid for occupant in occupants if occupant.key in snap.pods.deleting.get(name, ())}
        already = frozenset(going | set((given or {}).get(name, frozenset())))
        answer = victims_on(node, usage, occupants, planner, priority, already, best if cheapest_only else None)
        if isinstance(answer, NoVictims) and answer.reason == DEARER:
            dearer += 1
        elif isinstance(answer, NoVictims):
            refused[name] = answer.reason
        else:
            found[name] = answer
            best = answer.cost if best is None else min(best, answer.cost)
    return PreemptionChoice(found, refused)
