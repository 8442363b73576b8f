"""inflight: which pod and container a kubelet Allocate belongs to (DESIGN.md section 2, rule 3).
Pure: pods are API-server dicts built here."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import (
    ALLOCATION_ANNOTATION,
    AllocationRecord,
    ContainerAllocation,
    DeviceSlice,
    encode_record,
)
from rocshare_agent.deviceplugin.inflight import Refusal, find_in_flight, next_container

NODE = "node-a"


def record(*containers: tuple[str, int], node: str = NODE) -> AllocationRecord:
    return AllocationRecord(node=node, containers=[
        ContainerAllocation(name=name, devices=[DeviceSlice(gpu_id=f"G{k}", memory_mib=1024, cu_count=10) for k in range(n)])
        for name, n in containers])


def pod(name: str, gpus: dict[str, int], *, rec: AllocationRecord | str | None = None, node: str = NODE,
        phase: str = "Pending", started: bool = False, deleting: bool = False, init: dict[str, int] | None = None) -> dict:
    annotations = {}
    if rec is not None:
        annotations[ALLOCATION_ANNOTATION] = rec if isinstance(rec, str) else encode_record(rec)
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def containers(spec: dict[str, int]) -> list[dict]:
        return [{"name": c, "resources": {"limits": {"amd.com/gpu": str(n)}} if n else {}} for c, n in spec.items()]

    return {"metadata": meta, "spec": {"nodeName": node, "containers": containers(gpus),
                                       "initContainers": containers(init or {})},
            "status": {"phase": phase, **({"startTime": "2026-01-01T00:00:00Z"} if started else {})}}


def test_the_one_committed_pod_is_in_flight():
    pods = [pod("admitted", {"c": 1}, rec=record(("c", 1)), started=True),
            pod("running", {"c": 1}, rec=record(("c", 1)), phase="Running"),
            pod("elsewhere", {"c": 1}, rec=record(("c", 1)), node="node-b"),
            pod("cpu-only", {"c": 0}),
            pod("it", {"a": 1, "b": 2}, rec=record(("a", 1), ("b", 2)))]
    assert find_in_flight(pods, NODE).pod.name == "it"


@pytest.mark.parametrize(("pods", "message", "annotated"), [
    pytest.param([], "no pod in flight on node node-a", None, id="nothing bound"),
    pytest.param([pod("bare", {"c": 1})], "no pod in flight", "bare", id="bound without a record: blamed"),
    pytest.param([pod("x", {"c": 1}, rec=record(("c", 1))), pod("y", {"c": 1}, rec=record(("c", 1)))],
                 "2 pods in flight", None, id="two in flight: refuse rather than guess"),
    pytest.param([pod("bad", {"c": 1}, rec="{not json")], "is not JSON", "bad", id="undecodable record"),
    pytest.param([pod("old", {"c": 1}, rec='{"version": 7}')], "unsupported version 7", "old", id="future version"),
    pytest.param([pod("moved", {"c": 1}, rec=record(("c", 1), node="node-b"))], "its record names node node-b", "moved",
                 id="record names another node"),
    pytest.param([pod("edited", {"c": 2}, rec=record(("c", 1)))], "record commits c=1 but the pod asks c=2", "edited",
                 id="record disagrees with the pod's limits"),
    pytest.param([pod("gone", {"c": 1}, rec=record(("c", 1)), deleting=True)], "no pod in flight", None,
                 id="being deleted"),
])
def test_refusals_say_why_and_whom(pods, message, annotated):
    with pytest.raises(Refusal, match=message) as caught:
        find_in_flight(pods, NODE)
    assert (caught.value.pod.name if caught.value.pod else None) == annotated


def test_init_containers_come_first_in_the_match():
    p = pod("init", {"main": 1}, init={"setup": 2}, rec=record(("setup", 2), ("main", 1)))
    in_flight = find_in_flight([p], NODE)
    assert next_container(in_flight, 0, 2).name == "setup"
    assert next_container(in_flight, 1, 1).name == "main"


def test_container_device_count_must_match_the_kubelet_request():
    in_flight = find_in_flight([pod("p", {"a": 1, "b": 2}, rec=record(("a", 1), ("b", 2)))], NODE)
    with pytest.raises(Refusal, match="kubelet asks 2 amd.com/gpu for the next container, but container a was committed 1"):
        next_container(in_flight, 0, 2)
    with pytest.raises(Refusal, match="already served"):
        next_container(in_flight, 2, 1)


def versioned(body: dict, version: str) -> dict:
    body["metadata"]["resourceVersion"] = version
    return body


def test_the_finder_answers_again_only_when_the_waiting_pods_change(monkeypatch):
    """The kubelet asks twice per container about the same pods: the second answer is the first
    one, without reading the request and record again; a new version of a waiting pod, or a pod
    joining or leaving the wait, is read afresh, and a refusal is raised each time it stands."""
    from rocshare_agent.deviceplugin import inflight

    reads = []
    real = inflight._in_flight_of
    monkeypatch.setattr(inflight, "_in_flight_of", lambda pods, node: reads.append(len(pods)) or real(pods, node))
    finder = inflight.InFlightFinder(NODE)
    running = versioned(pod("running", {"c": 1}, rec=record(("c", 1)), phase="Running"), "5")
    it = versioned(pod("it", {"c": 1}, rec=record(("c", 1))), "7")
    first = finder.find([running, it])
    assert finder.find([running, it]) is first and reads == [1]
    running["metadata"]["resourceVersion"] = "6"  # not awaiting allocation: no new read
    assert finder.find([running, it]) is first and reads == [1]
    other = versioned(pod("other", {"c": 1}, rec=record(("c", 1))), "8")
    for _ in range(2):
        with pytest.raises(Refusal, match="2 pods in flight"):
            finder.find([it, other])
    assert reads == [1, 2]
    assert finder.find([versioned(it, "9")]).pod.name == "it" and reads == [1, 2, 1]
