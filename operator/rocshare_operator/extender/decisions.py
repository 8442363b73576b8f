"""Filter and prioritize: pure functions over a `SchedulerState` snapshot.

Nothing here writes or reserves: kube-scheduler may drop a pod between filter and
bind, and a reservation made here would leak (DESIGN.md section 2, rule 1).
Rejections stay typed (reason words with GPU counts) until the reply is rendered
as the extender API's `"<n>/<total> <Reason>"` strings.

Speed (kube-scheduler may send thousands of node names per call): the core's `plan_pod`
answer for a node -- its score, or why the pod does not fit -- is memoised in
`state.plans` per node, keyed by what the answer depends on (the pod's GPU request and
the node's policy) and valid only while the node's ledger version and inventory object
are unchanged; prioritize, which kube-scheduler calls right after filter for the same
pod, and later pods of the same shape find the answers there. Answers for pods that name
no GPU uuid depend only on the node's shape and loads, and are also shared between nodes
alike. Quota, blocked nodes and pools are read fresh on every call. The memo holds
answers, not capacity: bind (`node_rejection` + the core's `allocate`) always plans again
against the current ledger, under its per-node lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from rocshare.api.models import Scheduling
from rocshare.core.allocate import plan_pod
from rocshare.core.fit import FitFailure, Reason
from rocshare.core.inventory import NodeInventory
from rocshare.core.policies import Policy, normalize_scores
from rocshare.core.quota import QuotaCost
from rocshare.core.request import PodRequest
from rocshare_operator.extender.quota import quota_verdict
from rocshare_operator.extender.state import SchedulerState

NO_INVENTORY = "NoGpuInventory"
"""The node has no published GPUs, no allocatable amd.com/gpu, or is in no pool."""
BLOCKED = "UndecodableAllocationRecord"
"""A pod on the node carries a record nobody can read: its GPUs stay blocked."""


@dataclass(frozen=True)
class Rejection:
    reasons: tuple[tuple[str, int], ...]
    total: int
    detail: str = ""

    @classmethod
    def of_fit(cls, failure: FitFailure) -> Rejection:
        return cls(tuple((reason.value, count) for reason, count in failure.reasons), failure.total)

    @classmethod
    def whole_node(cls, reason: str, total: int, detail: str = "") -> Rejection:
        return cls(((reason, total),), total, detail)

    def text(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:  # memoised rejections are rendered once, not once per reply
        summary = ", ".join(f"{count}/{self.total} {reason}" for reason, count in self.reasons)
        return f"{summary} ({self.detail})" if self.detail else summary


@dataclass(frozen=True)
class FilterResult:
    feasible: list[str]
    failed: dict[str, Rejection]

    def to_json(self) -> dict:
        return {"NodeNames": self.feasible, "FailedNodes": {name: r.text() for name, r in self.failed.items()},
                "FailedAndUnresolvableNodes": {}, "Error": ""}


def policy_for(state: SchedulerState, node_name: str, request: PodRequest) -> Policy:
    pool = state.pool_of(node_name)
    return Policy.resolve(pool.scheduling if pool else Scheduling(), request)


class _Pass:
    """One decision call for one pod: what is the same for every node is computed once."""

    def __init__(self, state: SchedulerState, request: PodRequest, *, memoised: bool = True) -> None:
        self.state = state
        self.request = request
        self.memoised = memoised
        self._inventories, self._pools, self._ledger = state.inventories, state.node_pools, state.ledger
        selection = request.selection
        self.shareable = not (selection.use_uuids or selection.nouse_uuids)  # else answers read GPU ids
        self.limits = state.quota_limits(request.namespace)
        self.quota_free = self.limits.memory_mib is None and self.limits.cores_pct is None and self.limits.gpus is None
        self.used = state.namespace_costs.get(request.namespace, QuotaCost())
        self._request_key = (request.gpu_key, request.cpu_milli, request.memory_mib)
        self._policies: dict[str | None, tuple[Policy, int]] = {}
        self._quota: dict[object, str | None] = {}

    def rejection(self, name: str, blocked: set[str]) -> Rejection | None:
        """Why the pod cannot go to this node now, or None when it can."""
        node = self._inventories.get(name)
        if node is None or not node.gpus:
            return Rejection.whole_node(NO_INVENTORY, 0)
        total = len(node.gpus)
        if name in blocked:
            return Rejection.whole_node(BLOCKED, total)
        over = None if self.quota_free else self._quota_verdict(node)
        if over is not None:
            return Rejection.whole_node(Reason.RESOURCE_QUOTA_NOT_FIT.value, total, over)
        answer = self.answer(name, node)
        return answer if isinstance(answer, Rejection) else None

    def answer(self, name: str, node: NodeInventory) -> float | Rejection:
        """plan_pod's verdict for the node: the score, or the typed reasons it does not fit."""
        found = self._policies.get(self._pools.get(name))  # inlined: this runs once per node
        policy, key = found if found is not None else self._policy(name)
        if not self.memoised:
            return self._plan(node, policy, key)
        table = self.state.plans.table(name, self._ledger.node_version(name), node)
        answer = table.get(key)
        if answer is None:
            answer = table[key] = self._plan(node, policy, key)
        return answer

    def _plan(self, node: NodeInventory, policy: Policy, key: int) -> float | Rejection:
        usage = self._ledger.usage(node)
        shared_key = None
        if self.memoised and self.shareable:
            shared_key = (node.shape, usage.loads, usage.cpu_milli, usage.memory_mib, key)
            answer = self.state.plans.shared.get(shared_key)
            if answer is not None:
                return answer
        plan = plan_pod(node, usage, self.request, policy)
        answer = Rejection.of_fit(plan) if isinstance(plan, FitFailure) else plan.score
        if shared_key is not None:
            self.state.plans.share(shared_key, answer)
        return answer

    def _policy(self, name: str) -> tuple[Policy, int]:
        """The node's pool policy and the memo key of (this request, that policy), once per pool."""
        policy = policy_for(self.state, name, self.request)
        key = self.state.plans.key_id((self._request_key, policy)) if self.memoised else -1
        found = self._policies[self._pools.get(name)] = (policy, key)
        return found

    def _quota_verdict(self, node: NodeInventory) -> str | None:
        # The verdict reads only the node's largest GPU memory and omittedCores: both in its shape.
        if node.shape not in self._quota:
            self._quota[node.shape] = quota_verdict(self.request, node, self.limits, self.used)
        return self._quota[node.shape]


def node_rejection(state: SchedulerState, request: PodRequest, name: str, blocked: set[str]) -> Rejection | None:
    """Why the pod cannot go to this node now, or None when it can -- planned afresh (bind's check)."""
    return _Pass(state, request, memoised=False).rejection(name, blocked)


def filter_nodes(state: SchedulerState, request: PodRequest, node_names: list[str]) -> FilterResult:
    blocked = state.blocked_nodes()
    decision = _Pass(state, request)
    feasible: list[str] = []
    failed: dict[str, Rejection] = {}
    for name in node_names:
        rejection = decision.rejection(name, blocked)
        if rejection is None:
            feasible.append(name)
        else:
            failed[name] = rejection
    return FilterResult(feasible, failed)


def prioritize(state: SchedulerState, request: PodRequest, node_names: list[str]) -> list[dict]:
    decision = _Pass(state, request)
    raw: dict[str, float] = {}
    for name in node_names:
        node = state.inventories.get(name)
        if node is None:
            continue
        answer = decision.answer(name, node)
        if not isinstance(answer, Rejection):
            raw[name] = answer
    scores = normalize_scores(raw)
    return [{"Host": name, "Score": scores.get(name, 0)} for name in node_names]
