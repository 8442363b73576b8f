"""The plan refresher: between decisions it plans, for every recently asked pod shape, the nodes
the ledger changed -- exactly what that shape's next decision would plan, so the decision then
plans nothing and answers as a fresh plan does. Shapes not asked recently are left to their next
decision. It wakes on a bind, a release or a pod event that changed the ledger."""

from __future__ import annotations

import asyncio

from rocshare.core.ids import pod_key
from rocshare_operator.extender import decisions
from rocshare_operator.extender.decisions import filter_nodes, node_rejection
from rocshare_operator.extender.plans import NodeMemo
from rocshare_operator.extender.refresh import Refresher
from rocshare_operator.extender.state import SchedulerState

from tests.unit.operator.test_extender_decisions import NAMESPACE, add_node, commit, count_plans, request, set_pool

NAMES = ["n1", "n2", "n3", "n4"]


def four_nodes() -> SchedulerState:
    state = SchedulerState()
    set_pool(state, "p", gpuPolicy="fragmentation-aware")
    for name in NAMES:
        add_node(state, name)
    return state


async def test_a_shape_asked_before_finds_the_changed_nodes_planned(monkeypatch) -> None:
    state = four_nodes()
    big = request("big", memory_mib=40000, cores_pct=60)
    filter_nodes(state.snapshot(), big, NAMES)
    refresher = Refresher(state)
    for serial, node in enumerate(("n1", "n2", "n1")):  # another shape's pods land
        commit(state, request(f"s{serial}", memory_mib=30000, cores_pct=30), node)
    state.accounts.uncommit(pod_key(NAMESPACE, "s1"))
    assert await refresher.catch_up() >= 2  # n1 and n2, for `big` (and the small shape, not asked: none)
    calls = count_plans(monkeypatch)
    result = filter_nodes(state.snapshot(), big, NAMES)
    assert calls[0] == 0
    fresh = {name: node_rejection(state.snapshot(), big, name) for name in NAMES}
    assert result.feasible == [name for name, why in fresh.items() if why is None]
    assert {name: why.text() for name, why in result.failed.items()} == {
        name: why.text() for name, why in fresh.items() if why is not None}
    assert await refresher.catch_up() == 0  # nothing changed since


async def test_shapes_not_asked_recently_are_left_to_their_next_decision(monkeypatch) -> None:
    monkeypatch.setattr(NodeMemo, "RECENT_ASKS", 3)
    state = four_nodes()
    old, recent = request("old", memory_mib=40000, cores_pct=60), request("recent", memory_mib=1024, cores_pct=10)
    filter_nodes(state.snapshot(), old, NAMES)
    for _ in range(3):
        filter_nodes(state.snapshot(), recent, NAMES)
    commit(state, request("s", memory_mib=30000, cores_pct=30), "n3")
    assert [memo.request.name for memo in state.plans.behind(state.ledger)] == ["recent"]
    assert await Refresher(state).catch_up() == 1


async def test_the_refresher_wakes_when_the_ledger_changes() -> None:
    state = four_nodes()
    pod = request("pod", memory_mib=4096, cores_pct=25)
    filter_nodes(state.snapshot(), pod, NAMES)
    task = asyncio.create_task(Refresher(state).run())
    try:
        commit(state, request("s", memory_mib=30000, cores_pct=30), "n4")
        for _ in range(20):
            await asyncio.sleep(0)
        assert state.plans.behind(state.ledger) == []
        await state.on_pod("DELETED", {"metadata": {"namespace": NAMESPACE, "name": "s"}})
        assert state.plans.behind(state.ledger)  # released: behind until the refresher's turn
        for _ in range(20):
            await asyncio.sleep(0)
        assert state.plans.behind(state.ledger) == []
    finally:
        task.cancel()


async def test_a_failing_refresh_is_logged_and_the_refresher_goes_on(monkeypatch, caplog) -> None:
    state = four_nodes()
    pod = request("pod", memory_mib=4096, cores_pct=25)
    filter_nodes(state.snapshot(), pod, NAMES)
    real, calls = decisions.refresh, []

    def fails_once(snap, memo):
        calls.append(memo)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(snap, memo)

    monkeypatch.setattr(decisions, "refresh", fails_once)
    task = asyncio.create_task(Refresher(state).run())
    try:
        commit(state, request("s1", memory_mib=30000, cores_pct=30), "n1")
        for _ in range(20):
            await asyncio.sleep(0)
        assert "a refresh failed" in caplog.text and not task.done()
        commit(state, request("s2", memory_mib=30000, cores_pct=30), "n2")
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(calls) == 2 and state.plans.behind(state.ledger) == []
    finally:
        task.cancel()
