"""rocshare_dev/devcluster/observe.py, the outside-rocshare readings the HA chaos and failover tests use.

Planted here: a slow extender. The old check that the restarted operator kept a second pod
behind the node's in-flight pod slept 8 s and asserted the pod unbound -- which a slow (or hung)
extender passes as well as one that refused the bind. The mended check waits for kube-scheduler's
FailedScheduling event naming the pod in flight, so the slow extender fails it."""

from __future__ import annotations

import asyncio

import pytest

from rocshare_dev.devcluster.observe import (
    Binding,
    LeaseLog,
    LeaseSample,
    deciders_against_lease,
    holder_host,
    wait_bind_refused_behind,
)

HOLDER = "chaos-c/first"
REFUSED = {"reason": "FailedScheduling", "message": "binding rejected: node chaos-inflight is still allocating pod "
                                                    "chaos-c/first; retry later"}


class Extender:
    """What the API server shows of a pod while an extender handles its bind: after `answer_after`
    polls it either refuses (an event) or binds; `never` answers nothing (a slow extender)."""

    def __init__(self, outcome: str, answer_after: int = 2) -> None:
        self.outcome, self.answer_after, self.polls = outcome, answer_after, 0

    async def pod(self) -> dict:
        self.polls += 1
        bound = self.outcome == "binds" and self.polls > self.answer_after
        return {"metadata": {"name": "second"}, "spec": {"nodeName": "chaos-inflight"} if bound else {}}

    async def events(self) -> list[dict]:
        return [REFUSED] if self.outcome == "refuses" and self.polls > self.answer_after else []


async def old_form(extender: Extender) -> None:
    """The check as it read before issue 44 (its sleep shortened)."""
    await asyncio.sleep(0.05)
    assert not (await extender.pod())["spec"].get("nodeName")


async def test_an_extender_that_refuses_passes_the_mended_check() -> None:
    extender = Extender("refuses")
    event = await wait_bind_refused_behind(extender.pod, extender.events, HOLDER, timeout_s=2, every_s=0.01)
    assert event is REFUSED


async def test_a_slow_extender_passed_the_old_check_and_fails_the_mended_one() -> None:
    await old_form(Extender("slow"))  # passes: the pod is merely not bound yet
    extender = Extender("slow")
    with pytest.raises(AssertionError, match="never refused"):
        await wait_bind_refused_behind(extender.pod, extender.events, HOLDER, timeout_s=0.2, every_s=0.01)


async def test_a_bind_through_the_gate_fails_the_mended_check_at_once() -> None:
    extender = Extender("binds")
    with pytest.raises(AssertionError, match="bound while chaos-c/first was still in flight"):
        await wait_bind_refused_behind(extender.pod, extender.events, HOLDER, timeout_s=5, every_s=0.01)


def test_binds_are_checked_against_the_lease_holder_of_their_moment() -> None:
    assert holder_host("replica-a_1b2c-3d") == "replica-a" and holder_host(None) is None
    lease = LeaseLog(kube=None, namespace="rocshare-system", name="rocshare-scheduler")
    lease.samples = [LeaseSample(10.0, "a", None), LeaseSample(10.2, "a", None), LeaseSample(20.0, "b", None)]
    assert deciders_against_lease([Binding("ns/p1", "a", 10.1), Binding("ns/p2", "b", 20.3)], lease) == []
    (problem,) = deciders_against_lease([Binding("ns/p3", "b", 10.1)], lease)
    assert "ns/p3 bound by b while the Lease named ['a']" == problem


def test_the_lease_taken_anew_is_a_later_acquire_or_a_new_object() -> None:
    lease = LeaseLog(kube=None, namespace="rocshare-system", name="rocshare-scheduler")
    lease.samples = [LeaseSample(100.0, "a", None, "1970-01-01T00:01:00.000000Z", "uid-1"),
                     LeaseSample(101.0, None, None),  # deleted by hand
                     LeaseSample(101.4, "a", None, "1970-01-01T00:01:00.000000Z", "uid-2")]  # recreated, old acquire
    assert lease.acquired_after(lambda: ["a", "b"], 100.5) == 101.4
    lease.samples.append(LeaseSample(110.0, "b", None, "1970-01-01T00:01:48.500000Z", "uid-2"))  # b took it at 108.5
    assert lease.acquired_after(lambda: ["a", "b"], 105.0) == 108.5
    assert lease.acquired_after(lambda: ["a"], 105.0) is None  # b is not live
