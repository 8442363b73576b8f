"""Fail closed by construction (issue 34): a fault planted in any step of a path the extender or
the agent takes (rocshare_dev.devcluster.faults, the harness's own fault injection) leaves the GPU
blocked -- never free, never offered with health the kubelet was not told.

Covers the extender's pod path (each step: the ledger, the waiting list, the fragmentation model),
a Node that stops decoding, pool settings, Node or AmdGpuNode that cannot be read (the node offers
nothing, with the typed NodeUnreadable reason), and the agent's inventory callback (the kubelet is
told again until it took it, and the AmdGpuNode never shows a GPU healthy that the kubelet was not
told of)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.node_settings import POOL_SETTINGS_ANNOTATION
from rocshare.core.request import parse_pod
from rocshare_dev.devcluster import faults
from rocshare_operator.extender.decisions import filter_nodes
from rocshare_operator.extender.retry import Retrier
from rocshare_operator.extender.server import subscribe as extender_subscribe
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.feed.cluster_feed import ClusterFeed
from rocshare_agent.inventory_loop import InventoryAgent
from tests.agent_fakes import RecordingKube
from tests.unit.agent.test_rediscovery import CAPTURE, dev_root  # noqa: F401 -- a fixture
from tests.unit.badinput.test_extender_state import gpu, pod, state_with
from tests.unit.operator.test_cluster_feed import GPU_NODES, NODES, ScriptedKube, settle
from tests.unit.operator.test_cluster_feed import node as feed_node

CU_COUNT = 104  # gpu()'s, an MI210's
HOSTNAME = {"kubernetes.io/hostname": "choke-n1"}  # the label the kubelet sets, which the planted fault reads


def whole_gpu_record() -> str:
    return encode_record(AllocationRecord.model_validate({"version": 1, "node": "n1", "containers": [
        {"name": "c", "devices": [{"gpuId": "GPU-1", "memoryMiB": 65520, "cuCount": CU_COUNT,
                                   "cuRanges": [[0, CU_COUNT - 1]], "coresPct": 100}]}]}))


def bound(name: str) -> dict:
    body = pod(name)
    body["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: whole_gpu_record()}
    body["spec"]["nodeName"] = "n1"
    body["status"] = {"phase": "Running", "startTime": "2026-12-03T10:00:00Z"}
    return body


@pytest.fixture
def planted() -> Iterator[list]:
    undo: list = []
    yield undo
    for step in reversed(undo):
        step()


@pytest.mark.parametrize("step", ["accounts", "workloads", "waiting"])
async def test_a_failing_step_of_the_pod_path_leaves_the_gpu_held(planted, step: str) -> None:
    state = state_with([gpu("GPU-1", 0)])
    state.retrier = Retrier(kube=None)  # never touches a pod here: nothing waits
    planted.append(faults.raise_on_events("flaky-", 1, step))
    with pytest.raises(faults.PlantedFault):
        await state.on_pod("ADDED", bound("flaky-1"))
    # Worked out here: the flaky pod holds every CU of the node's one GPU, so no pod asking a
    # slice of it may go there until the pod's event is taken.
    result = filter_nodes(state.snapshot(), parse_pod(pod("next", gpucores="10", gpumem="1000")), ["n1"])
    assert result.feasible == []
    assert "n1" in result.failed
    await state.on_pod("ADDED", bound("flaky-1"))  # the feed's retry: taken, and still held
    assert filter_nodes(state.snapshot(), parse_pod(pod("next", gpucores="10", gpumem="1000")), ["n1"]).feasible == []


# ---- the agent: the kubelet is told before anything is published as offered --------------------------


class KubeWithSettings(RecordingKube):
    """A Node carrying the pool-settings annotation as given."""

    def __init__(self, node_name: str, settings: str) -> None:
        super().__init__(node_name)
        self.settings = settings

    async def get(self, path: str) -> dict:
        return {"metadata": {"name": self.node_name, "uid": "node-uid",
                             "annotations": {POOL_SETTINGS_ANNOTATION: self.settings}}}


class Kubelet:
    """The device plugin's callback with a planted fault: it raises on the calls listed in `fail_on`
    (1-based), and otherwise records what the kubelet was told."""

    def __init__(self, *fail_on: int) -> None:
        self.fail_on, self.calls, self.told = set(fail_on), 0, []

    def __call__(self, gpus: list) -> None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise faults.PlantedFault("planted: the device plugin did not take the inventory")
        self.told.append({gpu.render_minor: gpu.healthy for gpu in gpus})


def published_health(kube: RecordingKube) -> dict[int, bool]:
    return {gpu["renderMinor"]: gpu["healthy"] for gpu in kube.published_statuses()[-1]["gpus"]}


async def test_a_failed_inventory_callback_is_made_again_on_the_next_check(dev_root: Path) -> None:
    kubelet = Kubelet(1)
    agent = InventoryAgent(RecordingKube("n"), node_name="n", sysfs_root=CAPTURE, dev_root=dev_root,
                           on_inventory=kubelet)
    await agent.check()
    assert kubelet.told == []
    await agent.check()  # nothing changed on the node, but the kubelet has not got the list yet
    assert kubelet.told == [dict.fromkeys(range(128, 136), True)]


async def test_a_recovered_gpu_is_published_healthy_only_once_the_kubelet_was_told(dev_root: Path) -> None:
    kube, kubelet = RecordingKube("n"), Kubelet(2, 3)
    agent = InventoryAgent(kube, node_name="n", sysfs_root=CAPTURE, dev_root=dev_root, on_inventory=kubelet)
    (dev_root / "dri" / "renderD130").unlink()
    await agent.check()
    assert published_health(kube)[130] is False and kubelet.told[-1][130] is False
    (dev_root / "dri" / "renderD130").write_text("")  # back, but the kubelet is not told (planted fault)
    await agent.check()
    await agent.check()
    assert published_health(kube) == kubelet.told[-1] == {**dict.fromkeys(range(128, 136), True), 130: False}
    await agent.check()
    assert published_health(kube) == kubelet.told[-1] == dict.fromkeys(range(128, 136), True)


async def test_pool_settings_that_cannot_be_read_make_the_agent_offer_nothing(dev_root: Path) -> None:
    kube, kubelet = KubeWithSettings("n", '{"version":1,"pool":"p","sharing":{"splitCount":"four"}}'), Kubelet()
    agent = InventoryAgent(kube, node_name="n", sysfs_root=CAPTURE, dev_root=dev_root, on_inventory=kubelet)
    await agent.check()
    assert kubelet.told == [dict.fromkeys(range(128, 136), False)]
    assert published_health(kube) == dict.fromkeys(range(128, 136), False)
    condition = next(c for c in kube.published_statuses()[-1]["conditions"] if c["type"] == "PoolSettings")
    assert (condition["status"], condition["reason"]) == ("False", "Unreadable") and "splitCount" in condition["message"]
    kube.settings = '{"version":1,"pool":"p","sharing":{"splitCount":4}}'
    agent._settings_at = None  # read the Node again now
    await agent.check()
    assert kubelet.told[-1] == dict.fromkeys(range(128, 136), True)


# ---- a Node or AmdGpuNode that stops decoding offers nothing, through the process's one feed -----------


async def test_a_node_that_stops_decoding_offers_nothing_not_its_old_facts(planted) -> None:
    kube = ScriptedKube({NODES: [feed_node("choke-n1", **HOSTNAME)], GPU_NODES: [{
        "metadata": {"name": "choke-n1"}, "status": {"gpus": [gpu("GPU-1", 0)]}}]})
    feed, state = ClusterFeed(kube), SchedulerState()
    extender_subscribe(feed, state)
    task = asyncio.create_task(feed.run())
    try:
        await asyncio.wait_for(feed.wait_synced(), 5)
        gpu_pod = parse_pod(pod("next", gpucores="10", gpumem="1000"))
        assert filter_nodes(state.snapshot(), gpu_pod, ["choke-n1"]).feasible == ["choke-n1"]
        planted.append(faults.choke_node_facts("choke-"))
        kube.push(NODES, "MODIFIED", feed_node("choke-n1", zone="z1", **HOSTNAME))
        await settle()
        rejection = filter_nodes(state.snapshot(), gpu_pod, ["choke-n1"]).failed["choke-n1"]
        assert rejection.reasons == (("NodeUnreadable", 0),) and "PlantedFault" in rejection.detail
        kube.push(GPU_NODES, "MODIFIED", {"metadata": {"name": "choke-n1"}, "status": {"gpus": 7}})
        await settle()
        planted.pop()()  # the Node reads again; its AmdGpuNode does not
        kube.push(NODES, "MODIFIED", feed_node("choke-n1", zone="z2", **HOSTNAME))
        await settle()
        rejection = filter_nodes(state.snapshot(), gpu_pod, ["choke-n1"]).failed["choke-n1"]
        assert rejection.reasons == (("NodeUnreadable", 0),) and "invalid status" in rejection.detail
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
