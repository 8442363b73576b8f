"""The score-only path for DRA pods (issue 42): the request admission keeps on the pod
(rocshare.api.dra_request), the DRA pools' nodes in the index, and the extender's prioritize
scoring them with the same planner, policy and hold index (claims included) that extender mode
uses. Expected levels are worked out here from the core's plan_pod and score_levels."""

from __future__ import annotations

import orjson
import pytest

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.api.dra_request import (DRA_REQUEST_ANNOTATION, ContainerLimits, DraRequest, DraRequestError,
                                      decode_request, encode_request, request_of, with_limits)
from rocshare.api.models import API_VERSION
from rocshare.api.node_settings import POOL_LABEL
from rocshare.core.allocate import plan_pod
from rocshare.core.fit import FitFailure
from rocshare.core.holdings import placement_request
from rocshare.core.ids import claim_key
from rocshare.core.inventory import NodeInventory
from rocshare.core.policies import score_levels
from rocshare_operator.admission.dra_pods import plan_dra
from rocshare_operator.extender.binder import Binder
from rocshare_operator.extender.decisions import policy_for
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.server import ExtenderService
from rocshare_operator.extender.state import SchedulerState
from tests.unit.operator.test_extender_decisions import add_node, gpu

NAMESPACE = "team"
LIMITS = {"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "50"}


def gpu_pod(name: str = "pod", limits: dict[str, str] | None = None) -> dict:
    return {"metadata": {"namespace": NAMESPACE, "name": name},
            "spec": {"containers": [{"name": "main", "resources": {"limits": dict(limits or LIMITS),
                                                                   "requests": {"cpu": "1"}}}]}}


def dra_pod(name: str = "pod", limits: dict[str, str] | None = None, state: SchedulerState | None = None) -> dict:
    """The pod as admission leaves it in a DRA pool: the claim instead of the limits, the annotation."""
    pod = gpu_pod(name, limits)
    shapes = [spec for node in (state.index.dra_nodes.values() if state else ()) for spec in node.gpus] or \
        list(NodeInventory.from_gpu_infos("x", [gpu("x", 0)], _sharing()).gpus)
    plan = plan_dra(pod, ("d",), shapes)
    assert plan.request is not None
    return {"metadata": {**pod["metadata"], "annotations": {DRA_REQUEST_ANNOTATION: encode_request(plan.request)}},
            "spec": plan.spec}


def _sharing():
    from rocshare.api.models import Sharing
    return Sharing()


def add_dra_node(state: SchedulerState, name: str, *, gpus: int = 4, pool: str = "d") -> None:
    """A node of a DRA pool as the operator sees it: no amd.com/gpu allocatable, its AmdGpuNode's GPUs."""
    state.on_node("ADDED", {"metadata": {"name": name, "labels": {POOL_LABEL: pool}}, "status": {"allocatable": {}}})
    state.on_gpu_node("MODIFIED", {"metadata": {"name": name},
                                   "status": {"gpus": [gpu(name, i).model_dump(by_alias=True) for i in range(gpus)]}})


def set_pool(state: SchedulerState, name: str, interface: str, **scheduling) -> None:
    state.on_pool("MODIFIED", {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
                               "spec": {"nodeSelector": {POOL_LABEL: name}, "scheduling": scheduling,
                                        "agent": {"interface": interface}}})


def hold_claim(state: SchedulerState, name: str, node: str, gpu_index: int, *, memory_mib: int, cus: int) -> None:
    """A claim allocated on `node`, as the operator's claim watch accounts it."""
    record = AllocationRecord(node=node, containers=[ContainerAllocation(name=name, devices=[DeviceSlice(
        gpu_id=f"GPU-{node}-{gpu_index}", memory_mib=memory_mib, cu_count=cus, cores_pct=cus * 100 // 104)])])
    state.accounts.on_claim(claim_key(NAMESPACE, name), NAMESPACE, node, record)


def service(state: SchedulerState) -> ExtenderService:
    return ExtenderService(state, Binder(None, state), ExtenderMetrics(state), ready=lambda: True)


async def prioritized(state: SchedulerState, pod: dict, names: list[str]) -> dict[str, int]:
    reply = orjson.loads(orjson.dumps(await service(state).prioritize_dra({"Pod": pod, "NodeNames": names})))
    return {entry["Host"]: entry["Score"] for entry in reply}


def expected_levels(state: SchedulerState, pod: dict, names: list[str]) -> dict[str, int]:
    """The core's own answer: plan_pod on each DRA node's GPUs and the ledger's usage, levelled (a
    policy that reads no fragmentation model, so the default scoring context)."""
    request = placement_request(with_limits(pod, request_of(pod)))
    snap = state.dra_snapshot()
    raw = {}
    for name in names:
        node = state.index.dra_nodes[name]
        plan = plan_pod(node, state.ledger.usage(node), request, policy_for(snap, name, request))
        raw[name] = None if isinstance(plan, FitFailure) else plan.score
    levels = score_levels({score for score in raw.values() if score is not None})
    return {name: 0 if score is None else levels[score] for name, score in raw.items()}


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    set_pool(state, "d", "DRA", nodePolicy="binpack", gpuPolicy="binpack")
    set_pool(state, "p", "DevicePlugin")
    for name in ("d1", "d2", "d3"):
        add_dra_node(state, name)
    add_node(state, "p1")
    return state


# ---- the request codec --------------------------------------------------------------------------


def test_the_request_round_trips_and_puts_the_limits_back_where_admission_took_them() -> None:
    request = DraRequest(containers=[ContainerLimits(kind="containers", index=0, limits=LIMITS)])
    assert decode_request(encode_request(request)) == request
    pod = dra_pod()
    assert "limits" not in pod["spec"]["containers"][0]["resources"]
    assert placement_request(with_limits(pod, request_of(pod))) == placement_request(gpu_pod())


@pytest.mark.parametrize("text", ["not json", "[]", '{"version": 2, "containers": []}',
                                  '{"version": 1, "containers": []}',
                                  '{"version": 1, "containers": [{"kind": "volumes", "index": 0, '
                                  '"limits": {"a": "1"}}]}'])
def test_an_undecodable_request_is_an_error_never_an_empty_request(text: str) -> None:
    with pytest.raises(DraRequestError):
        decode_request(text)


def test_a_request_naming_a_container_the_pod_lacks_is_an_error() -> None:
    request = DraRequest(containers=[ContainerLimits(kind="containers", index=3, limits=LIMITS)])
    with pytest.raises(DraRequestError, match=r"containers\[3\]"):
        with_limits(gpu_pod(), request)


def test_admission_keeps_every_gpu_containers_limits_and_nothing_else() -> None:
    pod = gpu_pod()
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"amd.com/gpu": "1"}}},
                                     {"name": "plain", "resources": {"limits": {"cpu": "1"}}}]
    shapes = list(NodeInventory.from_gpu_infos("x", [gpu("x", 0)], _sharing()).gpus)
    plan = plan_dra(pod, ("d",), shapes)
    assert plan.request == DraRequest(containers=[
        ContainerLimits(kind="initContainers", index=0, limits={"amd.com/gpu": "1"}),
        ContainerLimits(kind="containers", index=0, limits=LIMITS)])


# ---- the index: DRA nodes are scored, never offered ----------------------------------------------


def test_dra_nodes_are_in_the_dra_inventories_only_and_follow_their_pool(state: SchedulerState) -> None:
    assert set(state.index.dra_nodes) == {"d1", "d2", "d3"}
    assert "d1" not in state.inventories and "p1" in state.inventories and "p1" not in state.index.dra_nodes
    set_pool(state, "d", "DevicePlugin")  # the pool stops serving DRA: its nodes are no longer scored
    assert state.index.dra_nodes == {}
    set_pool(state, "d", "DRA")
    assert set(state.index.dra_nodes) == {"d1", "d2", "d3"}
    state.on_gpu_node("DELETED", {"metadata": {"name": "d2"}})
    assert set(state.index.dra_nodes) == {"d1", "d3"}


# ---- prioritize for DRA pods ------------------------------------------------------------------------


async def test_a_dra_pod_is_scored_by_the_pools_policy_with_the_claims_held(state: SchedulerState) -> None:
    hold_claim(state, "c1", "d2", 0, memory_mib=32768, cus=52)
    names = ["d1", "d2", "d3"]
    pod = dra_pod(state=state)
    got = await prioritized(state, pod, names)
    assert got == expected_levels(state, pod, names)
    assert max(got, key=got.get) == "d2" and got["d2"] > got["d1"] == got["d3"]  # binpack: the node a claim holds


async def test_a_node_whose_claims_leave_no_room_scores_nothing(state: SchedulerState) -> None:
    for index in range(4):
        hold_claim(state, f"c{index}", "d1", index, memory_mib=65536, cus=104)
    hold_claim(state, "c9", "d3", 0, memory_mib=16384, cus=26)
    pod = dra_pod(state=state)
    got = await prioritized(state, pod, ["d1", "d2", "d3"])
    assert got == expected_levels(state, pod, ["d1", "d2", "d3"])
    assert got["d1"] == 0 and got["d3"] == 10 > got["d2"]


async def test_the_fragmentation_model_learns_dra_pods_with_their_cpu(state: SchedulerState) -> None:
    from rocshare.api.dra import DRA_SCHEDULER_NAME

    for name, node in (("half", "d1"), ("web", "d2")):
        pod = dra_pod(name, state=state) if name == "half" else gpu_pod(name, {"cpu": "2"})
        pod["spec"].update(nodeName=node, schedulerName=DRA_SCHEDULER_NAME)
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
        await state.on_pod("ADDED", pod)
    sampled = set(state.workloads.windows["d"]._counts)
    assert sampled == {(2000, 1, 500, ()), (2000, 0, 0, ())}  # gpucores 50 (as admission kept it), a GPU-less task


async def test_a_pod_without_the_annotation_or_with_a_broken_one_gets_no_dra_scores(state: SchedulerState) -> None:
    plain = dra_pod(state=state)
    plain["metadata"]["annotations"] = {}
    assert set((await prioritized(state, plain, ["d1", "d2"])).values()) == {0}  # GPU-less here: nothing to score
    broken = dra_pod(state=state)
    broken["metadata"]["annotations"][DRA_REQUEST_ANNOTATION] = '{"version": 9}'
    assert await prioritized(state, broken, ["d1", "d2"]) == {"d1": 0, "d2": 0}


async def test_a_standby_replica_scores_dra_pods_and_still_refuses_to_decide(state: SchedulerState) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from rocshare_operator.extender.server import make_app
    from rocshare_operator.leadership import DecisionGate

    gate = DecisionGate(takeover_wait_s=0.0)
    gate.set_leading(False)
    standby = ExtenderService(state, Binder(None, state), ExtenderMetrics(state), ready=lambda: True, gate=gate)
    hold_claim(state, "c1", "d2", 0, memory_mib=32768, cus=52)
    args = {"Pod": dra_pod(state=state), "NodeNames": ["d1", "d2", "d3"]}
    async with TestClient(TestServer(make_app(standby))) as client:
        scored = await client.post("/extender/prioritize-dra", json=args)
        assert scored.status == 200
        assert {entry["Host"]: entry["Score"] for entry in await scored.json()} == \
            expected_levels(state, args["Pod"], args["NodeNames"])
        assert (await client.post("/extender/filter", json=args)).status == 503
