"""leadership.py: who leads from kube-scheduler's Lease identity, the peering status patch that
moves Kopf's reconcilers to the leader, and the decision gate (standby, takeover, abandon, drain)."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from rocshare_operator.leadership import (LEADER_PRIORITY, _drain_then, STANDBY_PRIORITY, DecisionGate, NotDeciding,
                                          holder_of, leads, peering_status)

NOW = datetime.datetime(2026, 12, 3, 11, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(("holder", "host", "expected"), [
    ("rocshare-operator-7d9f-abcde_0f1e2d3c-aaaa-bbbb-cccc-000011112222", "rocshare-operator-7d9f-abcde", True),
    ("rocshare-operator-7d9f-abcdef_0f1e2d3c", "rocshare-operator-7d9f-abcde", False),  # a longer pod name
    ("", "rocshare-operator-7d9f-abcde", False),  # released (ReleaseOnCancel empties it)
    ("node-a_1234", "", False),
])
def test_leads_by_the_hostname_prefix_of_the_lease_holder(holder: str, host: str, expected: bool) -> None:
    assert leads(holder, host) is expected


def test_holder_of_a_missing_or_released_lease_is_empty() -> None:
    assert holder_of(None) == "" and holder_of({"spec": {}}) == ""
    assert holder_of({"spec": {"holderIdentity": "a_1"}}) == "a_1"


def test_a_new_leader_raises_its_priority_and_drops_stale_leaders_only() -> None:
    peers = {"old-leader": {"priority": LEADER_PRIORITY, "lifetime": 60, "lastseen": "2026-12-03T10:59:30+00:00"},
             "standby": {"priority": STANDBY_PRIORITY, "lifetime": 60, "lastseen": "2026-12-03T10:59:50+00:00"},
             "me": {"priority": STANDBY_PRIORITY, "lifetime": 60, "lastseen": "2026-12-03T10:59:40+00:00"}}
    patch = peering_status(peers, "me", leading=True, lifetime_s=60, now=NOW)
    assert patch == {"me": {"priority": LEADER_PRIORITY, "lifetime": 60, "lastseen": "2026-12-03T11:00:00+00:00"},
                     "old-leader": None}


def test_a_standby_lowers_its_priority_and_touches_nobody_else() -> None:
    peers = {"leader": {"priority": LEADER_PRIORITY}, "me": {"priority": LEADER_PRIORITY}}
    assert peering_status(peers, "me", leading=False, lifetime_s=30, now=NOW) == {
        "me": {"priority": STANDBY_PRIORITY, "lifetime": 30, "lastseen": NOW.isoformat()}}


async def test_a_standby_refuses_after_waiting_for_a_takeover() -> None:
    gate = DecisionGate(leading=False, takeover_wait_s=0.05)
    started = asyncio.get_running_loop().time()
    with pytest.raises(NotDeciding, match="standby"):
        await gate.run(lambda: asyncio.sleep(0, result="decided"))
    assert asyncio.get_running_loop().time() - started >= 0.05


async def test_a_request_just_before_the_lease_event_is_served_once_it_arrives() -> None:
    gate = DecisionGate(leading=False, takeover_wait_s=5)
    decision = asyncio.create_task(gate.run(lambda: asyncio.sleep(0, result="decided")))
    await asyncio.sleep(0.01)
    assert not decision.done()
    gate.set_leading(True)
    assert await decision == "decided"


async def test_losing_the_lease_cancels_running_decisions() -> None:
    gate = DecisionGate()
    finished = []

    async def bind() -> None:
        await asyncio.sleep(10)
        finished.append("bound")

    waiting = asyncio.create_task(gate.run(bind))
    await asyncio.sleep(0.01)
    gate.set_leading(False)
    with pytest.raises(NotDeciding, match="abandoned"):
        await waiting
    assert not finished and not gate.running


async def test_drain_lets_short_decisions_finish_and_cancels_long_ones() -> None:
    gate = DecisionGate()
    short = asyncio.create_task(gate.run(lambda: asyncio.sleep(0.05, result="short")))
    long = asyncio.create_task(gate.run(lambda: asyncio.sleep(10, result="long")))
    await asyncio.sleep(0.01)
    await gate.drain(timeout_s=0.2)
    assert await short == "short"
    with pytest.raises(NotDeciding):
        await long
    with pytest.raises(NotDeciding, match="shutting down"):
        await gate.run(lambda: asyncio.sleep(0))
    assert gate.role() == "shutting down" and not gate.deciding()


async def test_the_callers_own_cancellation_cancels_the_decision() -> None:
    gate = DecisionGate()
    inner = asyncio.ensure_future(asyncio.sleep(10))
    outer = asyncio.create_task(gate.run(lambda: inner))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.sleep(0)
    assert inner.cancelled()


def test_the_leading_gauge_follows_the_gate() -> None:
    gate = DecisionGate(leading=False)
    assert [sample.value for family in gate.collect() for sample in family.samples] == [0.0]
    gate.leading = True
    assert [sample.value for family in gate.collect() for sample in family.samples] == [1.0]


async def test_sigterm_stops_kopf_after_the_drain_and_the_webhook_linger() -> None:
    gate, stopped_at = DecisionGate(), []
    loop = asyncio.get_running_loop()
    started = loop.time()
    await _drain_then(gate, lambda: stopped_at.append(loop.time() - started), linger_s=0.1)
    assert gate.draining and stopped_at and stopped_at[0] >= 0.1
