"""`settle_heap`: what the live extender (and its bench) does to the garbage collector once
its caches are built -- everything alive frozen out of the collector's sight, garbage made
later still collected, the collection thresholds left as they were. Restored after the test."""

from __future__ import annotations

import gc

import pytest

from rocshare_operator.extender.heap import settle_heap


@pytest.fixture
def restored_gc():
    yield
    gc.unfreeze()


def test_settling_freezes_the_caches_out_of_the_collectors_sight(restored_gc) -> None:
    caches = {f"node-{i}": {"gpus": [i] * 8} for i in range(1000)}
    threshold = gc.get_threshold()
    settle_heap()
    assert gc.get_freeze_count() >= len(caches)
    assert all(obj is not caches for obj in gc.get_objects())
    assert gc.get_threshold() == threshold


def test_garbage_made_after_settling_is_still_collected(restored_gc) -> None:
    settle_heap()
    cycle: list = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
