"""Filter and prioritize: pure functions over a `SchedulerState` snapshot.

Nothing here writes or reserves: kube-scheduler may drop a pod between filter and
bind, and a reservation made here would leak (DESIGN.md section 2, rule 1).
Rejections stay typed (reason words with GPU counts) until the reply is rendered
as the extender API's `"<n>/<total> <Reason>"` strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocshare.api.models import Scheduling
from rocshare.core.allocate import plan_pod
from rocshare.core.fit import FitFailure, Reason
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


def node_rejection(state: SchedulerState, request: PodRequest, name: str, blocked: set[str]) -> Rejection | None:
    """Why the pod cannot go to this node now, or None when it can."""
    node = state.inventories.get(name)
    if node is None or not node.gpus:
        return Rejection.whole_node(NO_INVENTORY, 0)
    total = len(node.gpus)
    if name in blocked:
        return Rejection.whole_node(BLOCKED, total)
    over = quota_verdict(request, node, state.quota_limits(request.namespace),
                         state.namespace_costs.get(request.namespace, QuotaCost()))
    if over is not None:
        return Rejection.whole_node(Reason.RESOURCE_QUOTA_NOT_FIT.value, total, over)
    plan = plan_pod(node, state.ledger.usage(node), request, policy_for(state, name, request))
    return Rejection.of_fit(plan) if isinstance(plan, FitFailure) else None


def filter_nodes(state: SchedulerState, request: PodRequest, node_names: list[str]) -> FilterResult:
    blocked = state.blocked_nodes()
    feasible: list[str] = []
    failed: dict[str, Rejection] = {}
    for name in node_names:
        rejection = node_rejection(state, request, name, blocked)
        if rejection is None:
            feasible.append(name)
        else:
            failed[name] = rejection
    return FilterResult(feasible, failed)


def prioritize(state: SchedulerState, request: PodRequest, node_names: list[str]) -> list[dict]:
    raw: dict[str, float] = {}
    for name in node_names:
        node = state.inventories.get(name)
        if node is None:
            continue
        plan = plan_pod(node, state.ledger.usage(node), request, policy_for(state, name, request))
        if not isinstance(plan, FitFailure):
            raw[name] = plan.score
    scores = normalize_scores(raw)
    return [{"Host": name, "Score": scores.get(name, 0)} for name in node_names]

