"""heap.IdleCollector: between requests, the collection the young generation's next allocations
would set off runs now, of the generation CPython's own rule would pick; nothing when the young
generation is not half full or the collector is off. What a full collection leaves is frozen, and
every THAW_AFTER_FULL_COLLECTIONS full collections the frozen heap is thawed and collected once, so
a reference cycle that became garbage while frozen is freed then."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from rocshare_operator.extender import heap
from rocshare_operator.extender.heap import IdleCollector

YOUNG_MAX = 10_000


@pytest.fixture
def small_generations() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(YOUNG_MAX, 3, 2)  # no automatic collection within a test's few thousand objects
    gc.enable()
    gc.collect()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()


def allocate(containers: int) -> list:
    return [[index] for index in range(containers)]


def test_the_young_generation_is_collected_once_half_full(small_generations) -> None:
    collect_when_idle = IdleCollector().collect
    kept = allocate(YOUNG_MAX // 4)
    assert collect_when_idle() is None  # a quarter full: not yet
    kept += allocate(YOUNG_MAX // 2)
    assert collect_when_idle() == 0 and gc.get_count()[0] < YOUNG_MAX // 10
    assert len(kept) == 3 * YOUNG_MAX // 4


def test_the_older_generations_when_their_turn_has_come(small_generations) -> None:
    collect_when_idle = IdleCollector().collect
    generations = []
    for _ in range(12):
        kept = allocate(YOUNG_MAX * 3 // 4)
        generations.append(collect_when_idle())
        del kept
    # three young collections, then the middle one (each young one counts one for it); once two
    # middle ones (the old generation's threshold) were counted, the next middle one is a full one
    assert generations == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2]


def test_nothing_while_the_collector_is_off(small_generations) -> None:
    collect_when_idle = IdleCollector().collect
    gc.disable()
    kept = allocate(YOUNG_MAX * 3 // 4)
    assert collect_when_idle() is None and gc.get_count()[0] >= YOUNG_MAX // 2
    assert kept


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_full_collection_freezes_its_survivors_and_a_thaw_frees_frozen_cycles(small_generations,
                                                                                 monkeypatch) -> None:
    monkeypatch.setattr(heap, "THAW_AFTER_FULL_COLLECTIONS", 3)
    collector = IdleCollector()

    def full_collection() -> None:
        gc.collect()
        for _ in range(20):  # young collections until the middle and old counts call for a full one
            kept = allocate(YOUNG_MAX * 3 // 4)
            if collector.collect() == 2:
                return
            del kept
        raise AssertionError("no full collection came")

    survivors = [Cycle() for _ in range(100)]
    full_collection()
    assert gc.get_freeze_count() >= 100
    alive = [weakref.ref(cycle) for cycle in survivors]
    del survivors  # garbage now, but frozen: no collection sees it
    gc.collect()
    assert all(ref() is not None for ref in alive)
    full_collection()  # the second: still frozen
    assert all(ref() is not None for ref in alive)
    full_collection()  # the third: thawed, collected, frozen again -- the cycles are gone
    assert all(ref() is None for ref in alive)
