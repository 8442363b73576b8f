"""Regression for the extender's state after its process was SIGKILLed and restarted (see
tests/e2e/test_chaos.py::test_restarted_operator_keeps_one_pod_in_flight_per_node).

* The in-flight gate (DESIGN.md section 2, rule 2) lived only in memory: a pod bound before the
  restart, not yet admitted by its kubelet, must be in flight again, or a second bind to its node
  makes the agent refuse both pods.
* Since issue 18 the gate is released by the kubelet's own first status write after binding
  (status.startTime set, or phase Failed), not by an agent mark: a pod the kubelet admitted is no
  longer in flight, and an `allocated` annotation alone (what older agents wrote) releases nothing.
"""

from __future__ import annotations

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare_operator.extender.state import SchedulerState


def record(node: str = "n1") -> str:
    return encode_record(AllocationRecord.model_validate({
        "version": 1, "node": node,
        "containers": [{"name": "c0", "devices": [{"gpuId": "GPU-1", "memoryMiB": 1024, "cuCount": 4,
                                                   "cuRanges": [[0, 3]]}]}]}))


def pod(name: str, *, node: str = "", phase: str = "Pending", annotations: dict | None = None,
        conditions: list | None = None, deleting: bool = False, started: bool = False) -> dict:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"schedulerName": "rocshare-scheduler", "nodeName": node},
            "status": {"phase": phase, "conditions": conditions or [],
                       **({"startTime": "2026-01-01T00:00:00Z"} if started else {})}}


async def test_bound_unserved_pod_is_in_flight_again_after_a_restart() -> None:
    state = SchedulerState()
    await state.on_pod("ADDED", pod("p1", node="n1", annotations={ALLOCATION_ANNOTATION: record()}))
    assert state.accounts.gate.held["n1"].pod == "ns/p1"
    # A second such pod (the state a restart without this rule produced) does not take the slot.
    await state.on_pod("ADDED", pod("p2", node="n1", annotations={ALLOCATION_ANNOTATION: record()}))
    assert state.accounts.gate.held["n1"].pod == "ns/p1"


async def test_admitted_running_or_deleting_pods_are_not_in_flight() -> None:
    for name, kwargs in [("admitted", {"started": True, "annotations": {ALLOCATION_ANNOTATION: record()}}),
                         ("running", {"phase": "Running", "annotations": {ALLOCATION_ANNOTATION: record()}}),
                         ("deleting", {"deleting": True, "annotations": {ALLOCATION_ANNOTATION: record()}})]:
        state = SchedulerState()
        await state.on_pod("ADDED", pod(name, node="n1", **kwargs))
        assert "n1" not in state.accounts.gate.held, name


async def test_the_kubelets_first_status_write_releases_the_gate() -> None:
    state = SchedulerState()
    await state.on_pod("ADDED", pod("p1", node="n1", annotations={ALLOCATION_ANNOTATION: record()}))
    assert "n1" in state.accounts.gate.held
    # An agent mark (older agents) is not the kubelet's word: still in flight.
    await state.on_pod("MODIFIED", pod("p1", node="n1", annotations={ALLOCATION_ANNOTATION: record(),
                                                                      "rocshare.io/allocated": "t"}))
    assert "n1" in state.accounts.gate.held
    # The kubelet admitted it (devices allocated) and wrote status.startTime, still Pending.
    await state.on_pod("MODIFIED", pod("p1", node="n1", started=True, annotations={ALLOCATION_ANNOTATION: record()}))
    assert "n1" not in state.accounts.gate.held
    assert "ns/p1" in state.ledger  # still holds its slice


async def test_the_kubelets_rejection_releases_the_gate_and_the_slice() -> None:
    state = SchedulerState()
    await state.on_pod("ADDED", pod("p1", node="n1", annotations={ALLOCATION_ANNOTATION: record()}))
    await state.on_pod("MODIFIED", pod("p1", node="n1", phase="Failed", annotations={ALLOCATION_ANNOTATION: record()}))
    assert "n1" not in state.accounts.gate.held and "ns/p1" not in state.ledger


async def test_committed_but_unbound_pod_is_not_in_flight_by_the_watch() -> None:
    # The binder marks in flight itself; the watch echo of the record before the Binding must not.
    state = SchedulerState()
    await state.on_pod("MODIFIED", pod("p1", annotations={ALLOCATION_ANNOTATION: record()}))
    assert not state.accounts.gate.held
