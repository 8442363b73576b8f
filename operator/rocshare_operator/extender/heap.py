"""The garbage collector's settings for the decision path, in one place for the live
extender and its benchmark (`rocshare-dev bench extender`), so the bench measures what runs.

Once the caches are built (every informer listed once), nearly everything alive lives as
long as the process: inventories, ledger records, node facts. `settle_heap` collects once
and moves all of it out of the collector's sight (`gc.freeze`), so no later collection
walks it -- at 5,000 nodes a full walk takes a hundred milliseconds and lands in some
decision's latency.

The young-generation threshold stays CPython's default on purpose. Measured at 1,000
nodes (1,000 decisions): the default collects about once a decision, each pause under
1 ms; thresholds of 2,000-10,000 collect 5-30 times in all, but each of those walks the
memo's freshly grown per-key tables and pauses 4-18 ms -- fewer, longer pauses, a worse
tail.

A decision allocates next to nothing (decisions.Priorities), so the collections come from the
refresher's work between decisions, and land in whichever call tips the count.
`IdleCollector.collect`, run at the end of the refresher's turn, runs the collection that is
coming anyway at that quiet moment instead: the generation CPython would pick once the
count tipped (the oldest past its threshold), so nothing is collected more often than by
CPython's own rule, except that a full collection skips its "long-lived objects grew by 25 %"
check -- which, with the caches frozen, passes nearly every time anyway -- and freezes what the
full collection leaves (see IdleCollector).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then freeze what survives (it is the process's long-lived caches)."""
    gc.collect()
    gc.freeze()


THAW_AFTER_FULL_COLLECTIONS = 50
"""Every this many idle full collections, the frozen heap is thawed and walked once (see IdleCollector)."""


class IdleCollector:
    """The collection that is coming anyway, run between requests; and what a full collection
    leaves, frozen.

    What survives a full collection is alive: mostly the pods, records and facts a burst added,
    which live as long as their pods. Frozen, the next full collections walk only what came after
    (at 2,000 pods on 500 nodes they took a tenth of the operator's CPU, walking the same
    survivors again and again). A frozen object is still freed when its last reference goes; only
    a reference cycle among frozen objects would stay. So every THAW_AFTER_FULL_COLLECTIONS full
    collections everything is unfrozen and collected once (cycles included), then frozen again:
    whatever such cycles hold is bounded by what that many collections' survivors can form."""

    def __init__(self) -> None:
        self._full_since_thaw = 0

    def collect(self) -> int | None:
        """Between requests: when the young generation is past half its threshold, run now the
        collection its next allocations would set off; returns the generation collected."""
        generation = _due_generation()
        if generation is None:
            return None
        if generation < 2:
            gc.collect(generation)
            return generation
        self._full_since_thaw += 1
        if self._full_since_thaw >= THAW_AFTER_FULL_COLLECTIONS:
            self._full_since_thaw = 0
            gc.unfreeze()
        gc.collect(2)
        gc.freeze()
        return 2


def _due_generation() -> int | None:
    """The generation CPython's rule would collect once the young count tips; None while the
    young generation is not half full (or the collector is off)."""
    young, middle, old = gc.get_count()
    young_max, middle_max, old_max = gc.get_threshold()
    if not gc.isenabled() or young < young_max // 2:
        return None
    if middle >= middle_max:
        return 2 if old >= old_max else 1
    return 0
