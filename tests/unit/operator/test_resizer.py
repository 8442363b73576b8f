"""The resizer's side effects (extender/resizer.py) against a one-pod stand-in for the API server
that honours resourceVersion preconditions: the new record is written once, the ledger holds the
covering record until the watch's echo, a Conflict is decided again from a fresh read, a refusal
writes only the condition and an Event, a DRA pod is refused with ResizeDraClaim. (The feature
itself is proven on the real control plane: tests/e2e/test_accounting.py.)"""

from __future__ import annotations

import copy
import json

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, \
    decode_record, encode_record
from rocshare.api.resize import RESIZE_ANNOTATION, RESIZED_CONDITION, ResizeRequest, encode_request
from rocshare.core.holdings import Held
from rocshare.kube.client import Conflict
from rocshare_operator.extender.resizer import Resizer
from rocshare_operator.extender.state import SchedulerState


class OnePod:
    def __init__(self, pod: dict) -> None:
        self.pod = copy.deepcopy(pod)
        self.conflicts = 0
        self.patches: list[dict] = []
        self.status: list[dict] = []
        self.events: list[dict] = []

    async def get(self, path: str) -> dict:
        return copy.deepcopy(self.pod)

    async def merge_patch(self, path: str, patch: dict) -> dict:
        if self.conflicts:
            self.conflicts -= 1
            self.pod["metadata"]["resourceVersion"] = str(int(self.pod["metadata"]["resourceVersion"]) + 1)
            raise Conflict(409, "Conflict", "the object has been modified")
        assert patch["metadata"]["resourceVersion"] == self.pod["metadata"]["resourceVersion"]
        self.patches.append(patch)
        self.pod["metadata"]["annotations"].update(patch["metadata"]["annotations"])
        return self.pod

    async def request(self, method: str, path: str, *, body: dict, content_type: str) -> dict:
        assert method == "PATCH" and path.endswith("/status")
        self.status.append(body["status"]["conditions"][0])
        return {}

    async def create(self, path: str, body: dict) -> dict:
        self.events.append(body)
        return body


def gpu(index: int) -> dict:
    return {"id": f"GPU-{index}", "index": index, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65536,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True}


OLD = AllocationRecord(node="n1", containers=[ContainerAllocation(name="c", devices=[
    DeviceSlice(gpu_id="GPU-0", memory_mib=4096, cu_ranges=[(0, 10)], cu_count=11, cores_pct=10)])])


def pod(request: ResizeRequest, *, claims: bool = False) -> dict:
    annotations = {RESIZE_ANNOTATION: encode_request(request)}
    if not claims:
        annotations[ALLOCATION_ANNOTATION] = encode_record(OLD)
    spec = {"nodeName": "n1", "containers": [{"name": "c"}]}
    if claims:
        spec["resourceClaims"] = [{"name": "rocshare-gpu-0", "resourceClaimTemplateName": "rocshare-gpu-x"}]
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "resourceVersion": "7",
                         "annotations": annotations}, "spec": spec, "status": {"phase": "Running", "startTime": "t"}}


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    state.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "10"}}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [gpu(0)]}})
    return state


async def test_grown_after_a_conflict_with_the_covering_record_held_until_the_echo(state: SchedulerState) -> None:
    server = OnePod(pod(ResizeRequest(generation=1, memory_mib=8192, cores_pct=20)))
    await state.on_pod("MODIFIED", server.pod)
    assert state.accounts.used("ns") == Held(4096, 10, 1)
    server.conflicts = 1
    await Resizer(server, state).decide("ns", "p", "uid-p")
    assert len(server.patches) == 1  # the first patch hit a Conflict: decided again from a fresh read
    new = decode_record(server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert new.generation == 1 and new.containers[0].devices[0].cu_ranges == [(0, 20)]
    assert state.accounts.used("ns") == Held(8192, 20, 1) and "ns/p" in state.accounts.interim  # covering
    await state.on_pod("MODIFIED", server.pod)  # the echo
    assert state.accounts.used("ns") == Held(8192, 20, 1) and "ns/p" not in state.accounts.interim
    assert state.ledger.record("ns/p") == new
    (condition,) = server.status
    assert (condition["type"], condition["status"], condition["reason"]) == (RESIZED_CONDITION, "True", "Resized")
    assert condition["message"].startswith("generation 1: container 'c': GPU GPU-0: 4096 -> 8192 MiB")
    assert [e["reason"] for e in server.events] == ["Resized"]


async def test_a_refusal_writes_the_condition_only(state: SchedulerState) -> None:
    server = OnePod(pod(ResizeRequest(generation=1, memory_mib=70000)))
    await state.on_pod("MODIFIED", server.pod)
    await Resizer(server, state).decide("ns", "p", "uid-p")
    assert server.patches == [] and state.ledger.record("ns/p") == OLD
    assert [(c["status"], c["reason"]) for c in server.status] == [("False", "ResizeInsufficientMemory")]
    assert server.events[0]["type"] == "Warning"


async def test_a_dra_pod_is_refused(state: SchedulerState) -> None:
    server = OnePod(pod(ResizeRequest(generation=2, cores_pct=50), claims=True))
    await Resizer(server, state).decide("ns", "p", "uid-p")
    assert [(c["status"], c["reason"]) for c in server.status] == [("False", "ResizeDraClaim")]
    assert "fixed by the claim's allocation" in server.status[0]["message"] and server.patches == []


async def test_an_applied_generation_is_not_decided_again(state: SchedulerState) -> None:
    applied = pod(ResizeRequest(generation=1, memory_mib=8192))
    applied["metadata"]["annotations"][ALLOCATION_ANNOTATION] = encode_record(
        OLD.model_copy(update={"resize_generation": 1}))
    server = OnePod(applied)
    await Resizer(server, state).decide("ns", "p", "uid-p")
    assert server.patches == server.status == []
    assert json.loads(server.pod["metadata"]["annotations"][RESIZE_ANNOTATION])["generation"] == 1


async def test_a_refused_generation_stays_refused_under_a_new_leader(state: SchedulerState) -> None:
    refused = pod(ResizeRequest(generation=4, memory_mib=8192))  # would fit now
    refused["status"]["conditions"] = [{"type": RESIZED_CONDITION, "status": "False", "reason": "ResizeQuotaExceeded",
                                        "message": "generation 4: the namespace's AmdGpuShare would be exceeded"}]
    server = OnePod(refused)
    await state.on_pod("MODIFIED", server.pod)
    await Resizer(server, state).decide("ns", "p", "uid-p")
    assert server.patches == server.status == [] and state.ledger.record("ns/p") == OLD
