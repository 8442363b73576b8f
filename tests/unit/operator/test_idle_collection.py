"""heap.collect_when_idle: between requests, the collection the young generation's next
allocations would set off runs now, of the generation CPython's own rule would pick; nothing
when the young generation is not half full or the collector is off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rocshare_operator.extender.heap import collect_when_idle

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
        gc.set_threshold(*before)
        if not enabled:
            gc.disable()


def allocate(containers: int) -> list:
    return [[index] for index in range(containers)]


def test_the_young_generation_is_collected_once_half_full(small_generations) -> None:
    kept = allocate(YOUNG_MAX // 4)
    assert collect_when_idle() is None  # a quarter full: not yet
    kept += allocate(YOUNG_MAX // 2)
    assert collect_when_idle() == 0 and gc.get_count()[0] < YOUNG_MAX // 10
    assert len(kept) == 3 * YOUNG_MAX // 4


def test_the_older_generations_when_their_turn_has_come(small_generations) -> None:
    generations = []
    for _ in range(12):
        kept = allocate(YOUNG_MAX * 3 // 4)
        generations.append(collect_when_idle())
        del kept
    # three young collections, then the middle one (each young one counts one for it); once two
    # middle ones (the old generation's threshold) were counted, the next middle one is a full one
    assert generations == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2]


def test_nothing_while_the_collector_is_off(small_generations) -> None:
    gc.disable()
    kept = allocate(YOUNG_MAX * 3 // 4)
    assert collect_when_idle() is None and gc.get_count()[0] >= YOUNG_MAX // 2
    assert kept
