"""Who writes is who decides (leadership.py): the retrier's touches and the pod events come only
from the replica whose scheduler leads, the decision gate's rule the pool loops follow too.

Two replicas see the same waiting pod and the same unaccountable hold; each writes to its own
recording API. The leader's write is the positive signal; the standby's own log line (retrier)
or its synchronous return (events) shows it had its turn and wrote nothing. tests/e2e/test_failover.py
runs two replicas against the real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from rocshare.kube.client import object_path
from rocshare_operator.extender.events import PodEvents
from rocshare_operator.extender.retry import RETRY_ANNOTATION, Retrier
from rocshare_operator.leadership import DecisionGate


class RecordingKube:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict]] = []

    async def merge_patch(self, path: str, patch: dict) -> dict[str, Any]:
        self.writes.append(("merge_patch", path, patch))
        return {}

    async def create(self, path: str, body: dict) -> dict[str, Any]:
        self.writes.append(("create", path, body))
        return body


def replica(leading: bool) -> tuple[RecordingKube, DecisionGate]:
    return RecordingKube(), DecisionGate(leading=leading)


async def until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_only_the_leaders_retrier_touches_waiting_pods(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rocshare_operator.extender.retry")
    (leader_kube, leader_gate), (standby_kube, standby_gate) = replica(True), replica(False)
    retriers = [Retrier(standby_kube, standby_gate), Retrier(leader_kube, leader_gate)]
    tasks = [asyncio.create_task(retrier.run()) for retrier in retriers]
    try:
        for retrier in retriers:
            retrier.note_waiting("ns/waiting", "ns")
            retrier.room_freed()
        await until(lambda: leader_kube.writes and any("standing by" in r.getMessage() for r in caplog.records))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert leader_kube.writes == [("merge_patch", object_path("v1", "pods", "waiting", namespace="ns"),
                                   {"metadata": {"annotations": {RETRY_ANNOTATION: "1"}}})]
    assert standby_kube.writes == []
    assert retriers[0].waiting == {"ns/waiting": "ns"}  # still known: it touches them once it leads


async def test_a_standby_that_takes_over_touches_the_pods_it_kept() -> None:
    kube, gate = replica(False)
    retrier = Retrier(kube, gate)
    task = asyncio.create_task(retrier.run())
    try:
        retrier.note_waiting("ns/waiting", "ns")
        gate.set_leading(True)
        retrier.room_freed()
        await until(lambda: kube.writes)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [path for _verb, path, _body in kube.writes] == [object_path("v1", "pods", "waiting", namespace="ns")]


async def test_only_the_leader_posts_the_unaccountable_event() -> None:
    (leader_kube, leader_gate), (standby_kube, standby_gate) = replica(True), replica(False)
    leader, standby = PodEvents(leader_kube, leader_gate), PodEvents(standby_kube, standby_gate)
    for events in (standby, leader):
        events.unaccountable("ns/held", "ns", "n1", "its allocation record cannot be read")
    assert standby._tasks == set()  # nothing scheduled: nothing can be written later
    await until(lambda: leader_kube.writes)
    [(verb, path, body)] = leader_kube.writes
    assert (verb, path, body["reason"]) == ("create", object_path("v1", "events", namespace="ns"),
                                            "UnaccountableAllocation")
    assert standby_kube.writes == []
