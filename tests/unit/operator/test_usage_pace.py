"""Reconcile loops pace wakes that are usage alone (context.USAGE, USAGE_PASS_S): a burst of
slices bound or released costs a pool or share one status pass per USAGE_PASS_S, not one per
pod, while any other wake (a node joining, a spec change) is taken at once -- also when it comes
during the pace."""

from __future__ import annotations

import asyncio
import time

import pytest

from rocshare_operator import context
from rocshare_operator.context import USAGE, Wakeups, pool_key
from rocshare_operator.reconcilers import pools
from rocshare_operator.reconcilers.pools import sleep_until_woken


class Never:
    """kopf.DaemonStopped as the loop reads it: never stopped."""

    def __bool__(self) -> bool:
        return False

    async def wait(self) -> None:
        await asyncio.Event().wait()


@pytest.fixture(autouse=True)
def short_pace(monkeypatch) -> None:
    monkeypatch.setattr(context, "USAGE_PASS_S", 0.5)
    monkeypatch.setattr(pools, "DEBOUNCE_S", 0.0)


async def woken_after_s(wakeups: Wakeups, state, *wakes: tuple[float, str]) -> float:
    """Seconds until `sleep_until_woken` returns, with each (delay, reason) wake sent meanwhile."""
    async def send() -> None:
        for delay_s, reason in wakes:
            await asyncio.sleep(delay_s)
            wakeups.wake(pool_key("p"), reason)

    sender = asyncio.ensure_future(send())
    started = time.monotonic()
    await sleep_until_woken(state, Never(), 10.0)
    await sender
    return time.monotonic() - started


async def test_usage_wakes_are_paced_and_others_are_not() -> None:
    wakeups = Wakeups()
    state = wakeups.register(pool_key("p"))
    state.take_reasons()  # a pass just ran
    assert await woken_after_s(wakeups, state, (0.0, USAGE), (0.05, USAGE)) == pytest.approx(0.5, abs=0.1)
    assert state.take_reasons() == {USAGE}
    assert await woken_after_s(wakeups, state, (0.0, "")) < 0.1  # a node, a spec: at once
    state.take_reasons()
    assert await woken_after_s(wakeups, state, (0.0, USAGE), (0.1, "daemonset")) == pytest.approx(0.1, abs=0.08)
    assert state.take_reasons() == {USAGE, "daemonset"}


async def test_a_usage_wake_long_after_the_last_pass_is_taken_at_once() -> None:
    wakeups = Wakeups()
    state = wakeups.register(pool_key("p"))
    state.take_reasons()
    state.passed_at -= 1.0  # the last pass was a pace ago
    assert await woken_after_s(wakeups, state, (0.0, USAGE)) < 0.1
