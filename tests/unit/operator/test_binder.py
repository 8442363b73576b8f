"""Bind starts from the pod kube-scheduler sent to filter (no read on the happy path) and writes
the record and the node in one request: a Binding carrying the record as annotations, with the
pod's uid and resourceVersion as preconditions. The API server here is a stand-in that keeps
one pod and applies a Binding as kube-apiserver's pods/binding does (preconditions, "already
assigned", annotations merged); tests/e2e/test_scheduling.py proves bind on the real one."""

from __future__ import annotations

import asyncio
import copy

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, decode_record
from rocshare.kube.client import ApiError, Conflict, NotFound, Unavailable
from rocshare_operator.extender import binder as binder_module
from rocshare_operator.extender.binder import SEEN_PODS_MAX, Binder, BindRefused
from rocshare_operator.extender.state import SchedulerState


class OnePodServer:
    """One pod; Bindings honour their preconditions; every call is logged. `fail_binding`:
    "before" fails without writing, "after" writes then fails (the reply is lost); `fail_reads`
    makes every GET fail."""

    def __init__(self, pod: dict) -> None:
        self.pod = copy.deepcopy(pod)
        self.calls: list[str] = []
        self.fail_binding: str | None = None
        self.fail_reads = False

    async def get(self, path: str) -> dict:
        self.calls.append("GET")
        if self.fail_reads:
            raise Unavailable(503, "ServiceUnavailable", "etcd is down")
        return copy.deepcopy(self.pod)

    async def create(self, path: str, binding: dict) -> dict:
        assert path.endswith("/binding")
        self.calls.append("BIND")
        if self.fail_binding == "before":
            raise Unavailable(0, "Unreachable", "connection reset")
        meta, wanted = self.pod["metadata"], binding["metadata"]
        if wanted.get("uid") not in ("", meta["uid"]) or wanted.get("resourceVersion") not in ("", meta["resourceVersion"]):
            raise Conflict(409, "Conflict", "precondition failed")
        if self.pod["spec"].get("nodeName"):
            raise Conflict(409, "Conflict", "pod p is already assigned")
        self.pod["spec"]["nodeName"] = binding["target"]["name"]
        meta.setdefault("annotations", {}).update(wanted.get("annotations", {}))
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if self.fail_binding == "after":
            raise ApiError(504, "Timeout", "the reply was lost")
        return {"kind": "Status", "status": "Success"}


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


async def test_a_pod_seen_at_filter_is_bound_in_one_request(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    binder = Binder(server, state)
    binder.saw(pod())
    record = await binder.bind("ns", "p", "uid-p", "n1")
    assert server.calls == ["BIND"]
    assert server.pod["spec"]["nodeName"] == "n1"
    assert decode_record(server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == record
    assert state.ledger.records()["ns/p"] == record and state.accounts.gate.held["n1"].pod == "ns/p"


async def test_a_stale_copy_costs_one_read_and_a_second_decision(state: SchedulerState) -> None:
    server = OnePodServer(pod(resource_version="6"))  # changed after kube-scheduler's copy
    binder = Binder(server, state)
    binder.saw(pod(resource_version="5"))
    record = await binder.bind("ns", "p", "uid-p", "n1")
    assert server.calls == ["BIND", "GET", "BIND"]
    assert server.pod["metadata"]["resourceVersion"] == "7"  # written once, on the fresh copy
    assert state.ledger.records()["ns/p"] == record


async def test_a_copy_of_another_pod_under_the_same_name_is_not_used(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    binder = Binder(server, state)
    binder.saw({**pod(), "metadata": {**pod()["metadata"], "uid": "uid-of-an-older-p"}})
    await binder.bind("ns", "p", "uid-p", "n1")
    assert server.calls == ["GET", "BIND"]


@pytest.fixture
def no_pauses(monkeypatch) -> None:
    monkeypatch.setattr(binder_module, "UNKNOWN_OUTCOME_READ_PAUSES_S", (0.0, 0.0, 0.0))


async def test_a_binding_written_but_unanswered_stands(state: SchedulerState, no_pauses) -> None:
    server = OnePodServer(pod())
    server.fail_binding = "after"
    record = await Binder(server, state).bind("ns", "p", "uid-p", "n1")
    assert server.calls == ["GET", "BIND", "GET"]
    assert decode_record(server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == record
    assert state.ledger.records()["ns/p"] == record and state.accounts.gate.held["n1"].pod == "ns/p"


async def test_a_binding_never_written_is_taken_back(state: SchedulerState, no_pauses) -> None:
    server = OnePodServer(pod())
    server.fail_binding = "before"
    with pytest.raises(BindRefused, match="connection reset"):
        await Binder(server, state).bind("ns", "p", "uid-p", "n1")
    assert "ns/p" not in state.ledger and "n1" not in state.accounts.gate.held
    assert not server.pod["spec"].get("nodeName")


async def bind_with_the_api_server_unreadable(state: SchedulerState) -> tuple[OnePodServer, Binder]:
    """A bind whose Binding gets no answer and whose pod cannot be read afterwards: refused."""
    server = OnePodServer(pod())
    server.fail_binding, server.fail_reads = "before", True
    binder = Binder(server, state)
    binder.saw(pod())
    with pytest.raises(BindRefused):
        await binder.bind("ns", "p", "uid-p", "n1")
    return server, binder


async def test_an_outcome_nobody_can_read_stays_accounted_until_the_next_bind_reads_it(
        state: SchedulerState, no_pauses) -> None:
    server, binder = await bind_with_the_api_server_unreadable(state)
    assert "ns/p" in state.ledger and state.accounts.gate.held["n1"].pod == "ns/p"  # blocked, not free
    server.fail_binding, server.fail_reads = None, False
    binder.saw(pod())  # kube-scheduler tries again, with its copy
    record = await binder.bind("ns", "p", "uid-p", "n1")
    assert server.calls[-2:] == ["GET", "BIND"]  # the copy is not trusted over the lost attempt
    assert state.ledger.records() == {"ns/p": record}
    assert decode_record(server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == record
    for task in binder._settling:  # still asleep (5 s); it would find its decision replaced
        task.cancel()


async def test_an_unreadable_outcome_is_settled_in_the_background_once_reads_work(
        state: SchedulerState, no_pauses, monkeypatch) -> None:
    monkeypatch.setattr(binder_module, "SETTLE_LATER_PAUSE_S", (0.0, 0.0))
    server, binder = await bind_with_the_api_server_unreadable(state)
    assert "ns/p" in state.ledger
    server.fail_reads = False  # the API server answers again; kube-scheduler has not retried yet
    for _ in range(20):
        await asyncio.sleep(0)
    assert "ns/p" not in state.ledger and "n1" not in state.accounts.gate.held
    assert not binder._settling


async def test_a_pod_found_bound_has_its_record_accounted(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    first = await Binder(server, state).bind("ns", "p", "uid-p", "n1")
    await state.uncommit("ns/p")  # as if this process had restarted before the watch showed it
    with pytest.raises(BindRefused, match="already bound to n1"):
        await Binder(server, state).bind("ns", "p", "uid-p", "n1")
    assert state.ledger.records()["ns/p"] == first


def test_copies_are_bounded_oldest_first(state: SchedulerState) -> None:
    binder = Binder(OnePodServer(pod()), state)
    for index in range(SEEN_PODS_MAX + 1):
        binder.saw({"metadata": {"name": f"p{index}", "namespace": "ns"}})
    assert binder._seen_pod("ns/p0", "") is None
    assert binder._seen_pod(f"ns/p{SEEN_PODS_MAX}", "") is not None


async def test_a_late_event_from_before_the_binding_does_not_free_the_slice(state: SchedulerState) -> None:
    server = OnePodServer(pod())
    record = await Binder(server, state).bind("ns", "p", "uid-p", "n1")
    before_binding = {**pod(), "status": {"phase": "Pending"}}  # the watch is behind bind
    await state.on_pod("MODIFIED", before_binding)
    assert state.ledger.records() == {"ns/p": record}
    await state.on_pod("DELETED", before_binding)
    assert "ns/p" not in state.ledger


async def test_a_pod_gone_after_an_unanswered_binding_holds_nothing(state: SchedulerState, no_pauses) -> None:
    server = OnePodServer(pod())
    server.fail_binding = "before"

    async def gone(path: str) -> dict:
        raise NotFound(404, "NotFound", "pods \"p\" not found")

    binder = Binder(server, state)
    binder.saw(pod())
    server.get = gone  # deleted meanwhile (its DELETED event may have come before the commit)
    with pytest.raises(BindRefused):
        await binder.bind("ns", "p", "uid-p", "n1")
    assert "ns/p" not in state.ledger and "n1" not in state.accounts.gate.held


def count_decisions(monkeypatch) -> list[int]:
    """How many times bind plans (binder.bind_decision calls)."""
    calls = [0]
    real = binder_module.bind_decision

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(binder_module, "bind_decision", counted)
    return calls


async def test_a_bind_that_did_not_wait_plans_once(state: SchedulerState, monkeypatch) -> None:
    calls = count_decisions(monkeypatch)
    binder = Binder(OnePodServer(pod()), state)
    binder.saw(pod())
    await binder.bind("ns", "p", "uid-p", "n1")
    assert calls == [1]


async def test_a_bind_that_waited_while_the_ledger_changed_plans_again_and_takes_what_is_left(
        state: SchedulerState, monkeypatch) -> None:
    """The early decision is taken only while nothing changed: here the CUs it chose are taken by
    another commit while the bind waits for the node's in-flight pod, and the record bind writes
    plans around them."""
    calls = count_decisions(monkeypatch)
    other = {**pod(), "metadata": {**pod()["metadata"], "name": "other", "uid": "uid-other"}}
    other_server = OnePodServer(other)
    await Binder(other_server, state).bind("ns", "other", "uid-other", "n1")
    binder = Binder(OnePodServer(pod()), state)
    binder.saw(pod())
    binding = asyncio.ensure_future(binder.bind("ns", "p", "uid-p", "n1"))
    await asyncio.sleep(0.05)  # waiting for "other", in flight on n1
    assert calls == [2] and not binding.done()
    early = binder_module.bind_decision(state.snapshot(), binder_module.placement_request(pod()), "n1")
    state.commit("ns/third", "ns", early)  # what the early decision chose, taken meanwhile
    admitted = {**other_server.pod, "status": {"phase": "Running", "startTime": "2026-12-02T00:00:00Z"}}
    await state.on_pod("MODIFIED", admitted)  # the kubelet admitted "other": the gate opens
    record = await binding
    assert calls == [4]  # (the test's own plan is the third) planned again after the wait
    taken = {tuple(r) for c in early.containers for d in c.devices for r in d.cu_ranges}
    assert taken and not taken & {tuple(r) for c in record.containers for d in c.devices for r in d.cu_ranges}
