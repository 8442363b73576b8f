"""Bad node annotations, AmdGpuNode statuses, quotas and pod records fed to the extender's
state: it never crashes, logs the problem once with what is wrong, and never offers capacity it
cannot account for (a node with a doubled GPU offers nothing; a pod with an unreadable record
keeps its node blocked; bad pool settings make the node offer nothing)."""

from __future__ import annotations

import logging

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.node_settings import POOL_SETTINGS_ANNOTATION
from rocshare.core.request import parse_pod
from rocshare_operator.extender.decisions import filter_nodes
from rocshare_operator.extender.state import SchedulerState


def gpu(gpu_id: str, index: int, **changes) -> dict:
    return {"id": gpu_id, "index": index, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65520,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True, **changes}


def node(name: str = "n1", settings: str | None = None) -> dict:
    annotations = {POOL_SETTINGS_ANNOTATION: settings} if settings is not None else {}
    return {"metadata": {"name": name, "labels": {}, "annotations": annotations},
            "status": {"allocatable": {"amd.com/gpu": "20"}}}


def pod(name: str = "p", **limits: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {f"amd.com/{k}": v for k, v in (limits or {"gpu": "1"}).items()}}}]}}


def state_with(gpus: list[dict], settings: str | None = None) -> SchedulerState:
    state = SchedulerState()
    state.on_node("ADDED", node(settings=settings))
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": gpus}})
    return state


def test_a_gpu_listed_twice_makes_the_node_offer_nothing(caplog) -> None:
    with caplog.at_level(logging.ERROR):
        state = state_with([gpu("GPU-1", 0), gpu("GPU-1", 1)])
    assert "n1" not in state.inventories
    assert "lists GPU GPU-1 more than once" in caplog.text
    result = filter_nodes(state.snapshot(), parse_pod(pod(gpu="2", gpumem="1000")), ["n1"])
    assert result.feasible == [] and "NodeUnreadable" in result.failed["n1"].text()


def test_the_doubled_gpu_is_logged_once_and_the_node_returns_when_fixed(caplog) -> None:
    state = state_with([gpu("GPU-1", 0), gpu("GPU-1", 1)])
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        state.on_gpu_node("MODIFIED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu("GPU-1", 0), gpu("GPU-1", 1)]}})
    assert "more than once" not in caplog.text  # the same problem again: no new log line
    state.on_gpu_node("MODIFIED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu("GPU-1", 0), gpu("GPU-2", 1)]}})
    assert len(state.inventories["n1"].gpus) == 2


@pytest.mark.parametrize(("status", "message"), [
    ({"gpus": [gpu("GPU-1", 0, cuCount="many")]}, "cuCount"),
    ({"gpus": [gpu("GPU-1", 0, splitCount=0)]}, "splitCount"),
    ({"gpus": [{"id": "GPU-1"}]}, "index"),
    ({"gpus": "GPU-1"}, "gpus"),
    ({"deviceMemoryScaling": 9}, "deviceMemoryScaling"),
], ids=["cu count as text", "split count 0", "missing fields", "gpus not a list", "scaling out of range"])
def test_invalid_gpu_node_status_is_ignored_with_the_field(caplog, status: dict, message: str) -> None:
    state = SchedulerState()
    state.on_node("ADDED", node())
    with caplog.at_level(logging.ERROR):
        state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": status})
    assert "n1" not in state.inventories
    assert "invalid status" in caplog.text and message in caplog.text


@pytest.mark.parametrize("settings", [
    '{"version":1,"pool":"p","sharing":{"splitCount":4}',  # truncated
    '{"version":1,"pool":"p","sharing":{"splitCount":"four"}}',  # wrong type
    "[]",
], ids=["truncated JSON", "wrong type", "an array"])
def test_bad_pool_settings_make_the_node_offer_nothing_with_why(caplog, settings: str) -> None:
    with caplog.at_level(logging.ERROR):
        state = state_with([gpu("GPU-1", 0)], settings=settings)
    assert "n1" not in state.inventories  # fail closed: never the defaults (up to 10 pods per GPU)
    assert "rocshare.io/pool-settings is invalid" in caplog.text and "offers nothing" in caplog.text
    rejection = filter_nodes(state.snapshot(), parse_pod(pod()), ["n1"]).failed["n1"]
    assert rejection.reasons == (("NodeUnreadable", 0),) and "pool settings cannot be read" in rejection.detail


async def test_an_unreadable_record_blocks_its_node_and_frees_it_when_the_pod_ends(caplog) -> None:
    state = state_with([gpu("GPU-1", 0)])
    broken = {**pod("forged"), "metadata": {"name": "forged", "namespace": "ns",
                                           "annotations": {ALLOCATION_ANNOTATION: '{"version":1,"node":"n1"'}}}
    broken["spec"]["nodeName"] = "n1"
    with caplog.at_level(logging.ERROR):
        await state.on_pod("ADDED", broken)
    assert "is not JSON" in caplog.text and "takes no new pods" in caplog.text
    assert "UndecodableAllocationRecord" in filter_nodes(state.snapshot(), parse_pod(pod()), ["n1"]).failed["n1"].text()
    await state.on_pod("DELETED", broken)
    assert filter_nodes(state.snapshot(), parse_pod(pod()), ["n1"]).feasible == ["n1"]


@pytest.mark.parametrize(("hard", "expected"), [
    ({"limits.amd.com/gpumem": "lots"}, 0), ({"limits.amd.com/gpumem": "1.5"}, 0),
    ({"limits.amd.com/gpumem": "2k"}, 2000), ({"limits.amd.com/gpumem": "40k"}, 40000),
    ({"limits.amd.com/gpumem": "3e3"}, 3000), ({"limits.amd.com/gpumem": "-3"}, 0), ({}, None),
])
def test_quota_values_are_read_as_the_api_server_writes_them_and_unreadable_ones_allow_nothing(
        caplog, hard: dict, expected) -> None:
    state = SchedulerState()
    with caplog.at_level(logging.ERROR):
        state.on_quota("ADDED", {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": hard}})
    assert state.quota_limits("ns").memory_mib == expected
    if expected == 0:  # fail closed: an unreadable limit is no licence to take everything
        assert "limits.amd.com/gpumem is in MiB: " in caplog.text and "counting it as 0" in caplog.text


def test_allocatable_that_is_not_a_number_offers_nothing_and_does_not_crash() -> None:
    state = SchedulerState()
    state.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "ten"}}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu("GPU-1", 0)]}})
    # Fail closed: a node whose allocatable GPUs cannot be read takes no new pods.
    assert "n1" not in state.inventories
    state.on_node("MODIFIED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "1k"}}})
    assert "n1" in state.inventories  # "1k" is how the API server writes 1000
