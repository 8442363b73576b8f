"""The extender's accounts (rocshare_operator/holds.py): the in-flight gate bind acquires and the pod watch
releases; pods that cannot be accounted for block their node and their namespace's quota and are
reported once; the quota check refuses a limited namespace holding one."""

from __future__ import annotations

import asyncio
import time

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import ShareLimits
from rocshare.core.holdings import Held
from rocshare.core.request import parse_pod
from rocshare_operator.holds import Accounts, InFlightGate
from rocshare_operator.extender.quota import quota_verdict
from rocshare_operator.feed.cluster_facts import pod_facts

from ..core.helpers import gpu, node


def pod(name: str, text: str | None, *, node_name: str = "n1", phase: str = "Running") -> dict:
    annotations = {ALLOCATION_ANNOTATION: text} if text is not None else {}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def record(node_name: str = "n1") -> str:
    return encode_record(AllocationRecord.model_validate({"version": 1, "node": node_name, "containers": [
        {"name": "c", "devices": [{"gpuId": "g1", "memoryMiB": 1000, "cuCount": 10, "cuRanges": [[0, 9]],
                                   "coresPct": 10}]}]}))


async def test_the_gate_lets_one_pod_in_flight_per_node_and_wakes_the_next() -> None:
    gate = InFlightGate()
    gate.acquire("n1", "ns/a")
    assert await gate.wait_free("n1", "ns/a", time.monotonic() + 1) is None  # its own bind may go on
    held = await gate.wait_free("n1", "ns/b", time.monotonic() + 0.05)
    assert held is not None and held.pod == "ns/a"
    waiter = asyncio.create_task(gate.wait_free("n1", "ns/b", time.monotonic() + 5))
    await asyncio.sleep(0.01)
    assert not gate.release("n1", "ns/other") and not waiter.done()
    assert gate.release("n1", "ns/a")
    assert await asyncio.wait_for(waiter, 1) is None


def test_an_unreadable_pod_blocks_its_node_and_quota_is_reported_once_and_freed_when_it_ends() -> None:
    accounts = Accounts()
    reported: list[tuple] = []
    accounts.on_unaccountable.append(lambda *args: reported.append(args))
    accounts.on_pod("ADDED", pod_facts(pod("ok", record())))
    broken = pod_facts(pod("broken", '{"version": 1, "node": "n1", "containers": "x"}'))
    accounts.on_pod("ADDED", broken)
    accounts.on_pod("MODIFIED", broken)
    assert accounts.blocked_nodes() == {"n1"}
    assert [args[:3] for args in reported] == [("ns/broken", "ns", "n1")] and "is invalid" in reported[0][3]
    assert accounts.used("ns") == Held(1000, 10, 1)  # the readable pod, by the one rule
    assert accounts.unaccountable_in("ns") and not accounts.unaccountable_in("other")
    limited = quota_verdict(parse_pod({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1"}}}]}}),
        node(gpu(0)), ShareLimits(memoryMiB=10**6), accounts.used("ns"), accounts.unaccountable_in("ns"))
    assert limited is not None and "cannot be read" in limited
    accounts.on_pod("DELETED", broken)
    assert accounts.blocked_nodes() == set() and not accounts.unaccountable


def test_an_unbound_pod_that_cannot_be_read_holds_nothing() -> None:
    accounts = Accounts()
    accounts.on_pod("ADDED", pod_facts({"metadata": {"name": "p", "namespace": "ns", "annotations": 7}}))
    assert accounts.blocked_nodes() == set() and accounts.unaccountable_in("ns") == []
