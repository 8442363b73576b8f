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
`collect_when_idle`, run at the end of the refresher's turn, runs the collection that is
coming anyway at that quiet moment instead: the generation CPython would pick once the
count tipped (the oldest past its threshold), so nothing is collected more often than by
CPython's own rule, except that a full collection skips its "long-lived objects grew by 25 %"
check -- which, with the caches frozen, passes nearly every time anyway.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then freeze what survives (it is the process's long-lived caches)."""
    gc.collect()
    gc.freeze()


def collect_when_idle() -> int | None:
    """Between requests: when the young generation is past half its threshold, run now the
    collection its next allocations would set off; returns the generation collected."""
    young, middle, old = gc.get_count()
    young_max, middle_max, old_max = gc.get_threshold()
    if not gc.isenabled() or young < young_max // 2:
        return None
    generation = 0
    if middle >= middle_max:
        generation = 2 if old >= old_max else 1
    gc.collect(generation)
    return generation
