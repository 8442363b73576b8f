"""Bind starts from the pod kube-scheduler sent to filter (no read on the happy path) and never
trusts that copy: the record's write carries its resourceVersion, and a Conflict means a fresh
read and a new decision. The API server here is a stand-in that keeps one pod and checks
preconditions as the real one does; tests/e2e/test_scheduling.py proves bind on the real one."""

from __future__ import annotations

import copy

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, decode_record
from rocshare.kube.client import Conflict
from rocshare_operator.extender.binder import SEEN_PODS_MAX, Binder
from rocshare_operator.extender.state import SchedulerState


class OnePodServer:
    """One pod; merge patches honour metadata.resourceVersion; every call is logged."""

    def __init__(self, pod: dict) -> None:
        self.pod = copy.deepcopy(pod)
        self.calls: list[tuple[str, str]] = []

    async def get(self, path: str) -> dict:
        self.calls.append(("GET", path))
        return copy.deepcopy(self.pod)

    async def merge_patch(self, path: str, patch: dict) -> dict:
        self.calls.append(("PATCH", path))
        meta = self.pod["metadata"]
        if patch["metadata"].get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise Conflict(409, "Conflict", "the object has been modified")
        meta.setdefault("annotations", {}).update(patch["metadata"].get("annotations", {}))
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.pod)

    async def create(self, path: str, body: dict) -> dict:
        self.calls.append(("POST", path))
        self.pod["spec"]["nodeName"] = body["target"]["name"]
        return body


def gpu(index: int) -> dict:
    return {"id": f"GPU-{index}", "index": index, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65520,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True}


def pod(resource_version: str = "5") -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "resourceVersion": resource_version},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "amd.com/gpu": "1", "amd.com/gpumem": "1024", "amd.com/gpucores": "10"}}}]}}


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    state.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "10"}}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu(0)]}})
    return state


async def test_a_pod_seen_at_filter_is_bound_without_a_read(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    binder = Binder(server, state)
    binder.saw(pod())
    record = await binder.bind("ns", "p", "uid-p", "n1")
    assert [verb for verb, _ in server.calls] == ["PATCH", "POST"]
    assert decode_record(server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == record
    assert "ns/p" in state.ledger and state.inflight["n1"].pod == "ns/p"


async def test_a_stale_copy_costs_one_read_and_a_second_decision(state: SchedulerState) -> None:
    server = OnePodServer(pod(resource_version="6"))  # changed after kube-scheduler's copy
    binder = Binder(server, state)
    binder.saw(pod(resource_version="5"))
    await binder.bind("ns", "p", "uid-p", "n1")
    assert [verb for verb, _ in server.calls] == ["PATCH", "GET", "PATCH", "POST"]
    assert server.pod["metadata"]["resourceVersion"] == "7"  # written once, on the fresh copy


async def test_a_copy_of_another_pod_under_the_same_name_is_not_used(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    binder = Binder(server, state)
    binder.saw({**pod(), "metadata": {**pod()["metadata"], "uid": "uid-of-an-older-p"}})
    await binder.bind("ns", "p", "uid-p", "n1")
    assert [verb for verb, _ in server.calls] == ["GET", "PATCH", "POST"]


def test_copies_are_bounded_oldest_first(state: SchedulerState) -> None:
    binder = Binder(OnePodServer(pod()), state)
    for index in range(SEEN_PODS_MAX + 1):
        binder.saw({"metadata": {"name": f"p{index}", "namespace": "ns"}})
    assert binder._seen_pod("ns/p0", "") is None
    assert binder._seen_pod(f"ns/p{SEEN_PODS_MAX}", "") is not None
