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
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then freeze what survives (it is the process's long-lived caches)."""
    gc.collect()
    gc.freeze()
