"""The extender's preemption on a SchedulerState fed real Pod objects (priority, uid, start,
nominations as the API server writes them): which node and victims, kube-scheduler's preempt
verb in its wire format (k8s.io/kube-scheduler/extender/v1, the meta form), the hold of a
nominated pod against lower-priority pods in filter and bind, quota and preemptionPolicy."""

from __future__ import annotations

import datetime as dt

import pytest

from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.holdings import placement_request
from rocshare.core.ids import pod_key
from rocshare.core.preemption import NO_LOWER_PRIORITY, NOT_ENOUGH_EVEN_EMPTIED
from rocshare_operator.extender.binder import Binder
from rocshare_operator.extender.decisions import Rejection, bind_decision, best_nodes, policy_for, preemption
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.preemptor import Preemptor
from rocshare_operator.extender.server import ExtenderService
from rocshare_operator.extender.state import SchedulerState

from .test_extender_decisions import NAMESPACE, add_node, set_pool

LOW, MID, HIGH = 100, 1000, 10000
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def pod_object(name: str, pct: int, priority: int, *, node: str = "", nominated: str = "", started_s: float = 60,
               deleting: bool = False, never: bool = False) -> dict:
    limits = {"amd.com/gpu": "1", "amd.com/gpumem-percentage": str(pct), "amd.com/gpucores": str(pct)}
    start = (NOW - dt.timedelta(seconds=started_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"namespace": NAMESPACE, "name": name, "uid": f"uid-{name}",
                         **({"deletionTimestamp": start} if deleting else {})},
            "spec": {"priority": priority, "nodeName": node, "schedulerName": "rocshare-scheduler",
                     **({"preemptionPolicy": "Never"} if never else {}),
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running" if node else "Pending", **({"startTime": start} if node else {}),
                       **({"nominatedNodeName": nominated} if nominated else {})}}


async def place(state: SchedulerState, name: str, pct: int, priority: int, node: str, **kw) -> dict:
    """Commit the pod's slice as bind would, then let the watch show the bound pod."""
    obj = pod_object(name, pct, priority, node=node, **kw)
    request = placement_request(obj)
    inventory = state.inventories[node]
    record = allocate(inventory, state.ledger.usage(inventory), request, policy_for(state.snapshot(), node, request))
    assert not isinstance(record, FitFailure), record
    state.commit(pod_key(NAMESPACE, name), NAMESPACE, record)
    await state.on_pod("MODIFIED", obj)
    return obj


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    set_pool(state, "p")
    add_node(state, "n1", gpus=1)
    add_node(state, "n2", gpus=1)
    return state


def traits(state):
    return state.snapshot().pods.pod_traits(NOW)


async def test_the_node_with_cheaper_victims_is_chosen(state) -> None:
    for i in range(2):
        await place(state, f"mid{i}", 50, MID, "n1")
        await place(state, f"low{i}", 50, LOW, "n2")
    high = placement_request(pod_object("high", 50, HIGH))
    assert best_nodes(state.snapshot(), high, ["n1", "n2"], priority=HIGH).feasible == []
    choice = preemption(state.snapshot(), high, HIGH, ["n1", "n2"], traits(state))
    assert sorted(choice.found) == ["n1", "n2"]
    assert choice.best.node == "n2" and len(choice.best.pods) == 1 and choice.best.pods[0].priority == LOW


async def test_equal_priority_is_never_a_victim_and_the_reason_says_so(state) -> None:
    await place(state, "a", 60, HIGH, "n1")
    await place(state, "b", 30, LOW, "n1")
    await place(state, "c", 100, HIGH, "n2")
    choice = preemption(state.snapshot(), placement_request(pod_object("high", 60, HIGH)), HIGH, ["n1", "n2"],
                        traits(state))
    assert choice.found == {} and choice.refused == {"n1": NOT_ENOUGH_EVEN_EMPTIED, "n2": NO_LOWER_PRIORITY}


async def test_the_preempt_verb_speaks_kube_schedulers_meta_form(state) -> None:
    """ExtenderPreemptionArgs{Pod, NodeNameToMetaVictims} -> ExtenderPreemptionResult{NodeNameToMetaVictims}:
    kube-scheduler's own victims are kept, the slice holders still needed added, a node where no
    set works dropped."""
    await place(state, "low0", 50, LOW, "n1")
    await place(state, "low1", 50, LOW, "n1")
    await place(state, "top", 100, HIGH, "n2")
    service = ExtenderService(state, Binder(None, state), ExtenderMetrics(state), ready=lambda: True)
    service.preemptor = Preemptor(None, state, service.metrics)
    args = {"Pod": pod_object("high", 50, HIGH),
            "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-cpu-hog"}], "NumPDBViolations": 1},
                                      "n2": {"Pods": [{"UID": "uid-cpu-hog2"}], "NumPDBViolations": 0}}}
    reply = await service.preempt(args)
    assert set(reply) == {"NodeNameToMetaVictims"}
    n1 = reply["NodeNameToMetaVictims"]["n1"]
    assert n1["NumPDBViolations"] == 1 and n1["Pods"][0] == {"UID": "uid-cpu-hog"}
    assert len(n1["Pods"]) == 2 and n1["Pods"][1]["UID"] in {"uid-low0", "uid-low1"}
    assert "n2" not in reply["NodeNameToMetaVictims"]


async def test_a_nominated_pod_holds_its_room_against_lower_priority(state) -> None:
    # n2 has one LOW 50 % slice being deleted (the victim) and nothing else; HIGH is nominated there.
    await place(state, "victim", 50, LOW, "n2", deleting=True)
    await place(state, "n1-full", 100, HIGH, "n1")
    await state.on_pod("MODIFIED", pod_object("high", 100, HIGH, nominated="n2"))
    low = placement_request(pod_object("newcomer", 50, LOW))
    snap = state.snapshot()
    refused = best_nodes(snap, low, ["n2"], priority=LOW)
    assert refused.feasible == [] and "n2" in refused.failed
    assert isinstance(bind_decision(snap, low, "n2", LOW), Rejection)
    # Without the nomination, the newcomer would fit beside the victim:
    await state.on_pod("MODIFIED", pod_object("high", 100, HIGH))
    assert best_nodes(state.snapshot(), low, ["n2"], priority=LOW).feasible == ["n2"]
    # A pod of higher priority than the nominee is not held back by it:
    await state.on_pod("MODIFIED", pod_object("high", 100, HIGH, nominated="n2"))
    assert best_nodes(state.snapshot(), placement_request(pod_object("urgent", 50, HIGH + 1)), ["n2"],
                      priority=HIGH + 1).feasible == ["n2"]


async def test_the_nominee_itself_binds_once_its_victims_are_gone(state) -> None:
    await place(state, "victim", 100, LOW, "n2", deleting=True)
    await state.on_pod("MODIFIED", pod_object("high", 100, HIGH, nominated="n2"))
    high = placement_request(pod_object("high", 100, HIGH))
    assert isinstance(bind_decision(state.snapshot(), high, "n2", HIGH), Rejection)  # still there
    choice = preemption(state.snapshot(), high, HIGH, ["n2"], traits(state))
    assert choice.found["n2"].pods == ()  # no more victims: the deleting one is taken as gone
    await state.on_pod("DELETED", pod_object("victim", 100, LOW, node="n2"))
    assert not isinstance(bind_decision(state.snapshot(), high, "n2", HIGH), Rejection)


async def test_over_quota_preempts_nobody(state) -> None:
    await place(state, "low", 100, LOW, "n1")
    state.on_quota("ADDED", {"metadata": {"namespace": NAMESPACE, "name": "q"},
                             "spec": {"hard": {"limits.amd.com/gpucores": "50"}}})
    choice = preemption(state.snapshot(), placement_request(pod_object("high", 60, HIGH)), HIGH, ["n1"],
                        traits(state))
    assert choice.found == {} and choice.quota is not None


async def test_preemption_policy_never_is_honoured(state) -> None:
    await place(state, "low", 100, LOW, "n1")
    metrics = ExtenderMetrics(state)
    preemptor = Preemptor(object(), state, metrics)  # a kube it must never touch
    obj = pod_object("high", 60, HIGH, never=True)
    preemptor.consider(obj, placement_request(obj), ["n1"])
    assert metrics.preemptions.labels("policy_never")._value.get() == 1
    assert not preemptor._tasks


async def test_dra_claims_are_never_victims_and_a_claim_pod_preempts_nobody(state) -> None:
    """Kubernetes 1.35-1.37 (no DRA preemption before 1.38, KEP-5690): a slice held through a
    ResourceClaim is not a pod the extender may evict, and a pod whose GPUs come from a claim asks
    the extender for no amd.com resource, so it starts no preemption."""
    from rocshare.core.ids import claim_key
    obj = pod_object("claimed", 100, LOW)
    request = placement_request(obj)
    inventory = state.inventories["n1"]
    record = allocate(inventory, state.ledger.usage(inventory), request, policy_for(state.snapshot(), "n1", request))
    state.accounts.on_claim(claim_key(NAMESPACE, "claim-0"), NAMESPACE, "n1", record)
    choice = preemption(state.snapshot(), placement_request(pod_object("high", 50, HIGH)), HIGH, ["n1"],
                        traits(state))
    assert choice.found == {} and choice.refused == {"n1": NO_LOWER_PRIORITY}
    metrics = ExtenderMetrics(state)
    preemptor = Preemptor(object(), state, metrics)
    dra_pod = {"metadata": {"namespace": NAMESPACE, "name": "dra"}, "spec": {
        "priority": HIGH, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]}}
    preemptor.consider(dra_pod, placement_request(dra_pod), ["n1"])
    assert not preemptor._tasks and not preemptor._busy


async def test_no_search_when_no_bound_pod_has_lower_priority(state) -> None:
    """The usual cluster (every pod at priority 0): a pod that fits nowhere starts no preemption
    task, so no PodDisruptionBudget list and no search per unschedulable try."""
    await place(state, "peer", 100, HIGH, "n1")
    preemptor = Preemptor(object(), state, ExtenderMetrics(state))
    obj = pod_object("equal", 60, HIGH)
    preemptor.consider(obj, placement_request(obj), ["n1"])
    assert not preemptor._tasks
    assert state.snapshot().pods.may_preempt(HIGH + 1) and not state.snapshot().pods.may_preempt(HIGH)
    await state.on_pod("DELETED", pod_object("peer", 100, HIGH, node="n1"))
    assert state.snapshot().pods.priorities == {}
