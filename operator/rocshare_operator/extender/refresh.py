"""Bringing the plan cache up to date between decisions.

A decision plans again the nodes the ledger changed since its pod shape was last asked about
(plans.py). For a shape asked rarely that is many nodes at once: a shape unseen for 75 binds
plans ~150 nodes, ~8 ms at 1,000 nodes, while its pod waits. The refresher does that work
between decisions instead: when the ledger changes (a bind, a pod's event), every recently asked
shape plans the changed nodes, one shape per turn of the event loop, so a request arriving
meanwhile waits for at most one shape's work. It changes no answer: it plans exactly what the
shape's next decision would (`decisions.refresh`), under the plan cache's one validity rule. It
also keeps the bulk planner's arrays (rocshare.core.fleet) in step with the ledger -- and fills them
once, a slice of nodes per turn, when they are empty -- so a cold decision reads no journal and
places no node itself. Its turn ends with the garbage collection its work brought near (heap.py),
so that collection does not land in the next decision.
"""

from __future__ import annotations

import asyncio
import logging

from rocshare_operator.extender import decisions
from rocshare_operator.extender.heap import IdleCollector
from rocshare_operator.extender.state import SchedulerState

log = logging.getLogger(__name__)
FILL_SLICE = 500
"""Nodes placed into the empty bulk arrays per turn of the loop (a few milliseconds each)."""


class Refresher:
    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        self._wake = asyncio.Event()
        self._collector = IdleCollector()
        state.ledger.on_change.append(self._wake.set)

    async def run(self) -> None:
        """Until cancelled. A failed refresh is logged and the loop goes on: decisions plan what the
        refresher could not, so a bug here costs latency, never a wrong answer or the extender."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.catch_up()
            except Exception:
                log.exception("plan refresher: a refresh failed; the next decisions plan those nodes themselves")

    async def catch_up(self) -> int:
        """Plan every recently asked shape's changed nodes, bring the bulk arrays up to date, then
        run the garbage collection that work brought near (heap.IdleCollector); returns the nodes
        planned."""
        planned = 0
        for memo in self.state.plans.behind(self.state.ledger):
            await asyncio.sleep(0)  # requests first: one shape's work per turn of the loop
            planned += decisions.refresh(self.state.snapshot(), memo)
        await asyncio.sleep(0)
        await self._keep_arrays()
        self._collector.collect()
        return planned

    async def _keep_arrays(self) -> None:
        """The ledger's changes into the bulk arrays; when they are empty (at start), every node with
        GPUs placed there, FILL_SLICE per turn. The arrays check themselves on every use, so this
        only moves work out of decisions."""
        fleet, ledger, inventories = self.state.fleet, self.state.ledger, self.state.inventories
        fleet.sync(ledger, inventories)
        if not fleet.empty:
            return
        names = [name for name, node in inventories.items() if node.gpus]
        for start in range(0, len(names), FILL_SLICE):
            nodes = [(name, inventories.get(name)) for name in names[start:start + FILL_SLICE]]
            nodes = [(name, node) for name, node in nodes if node is not None and node.gpus]  # may have gone
            fleet.locate([name for name, _ in nodes], [node for _, node in nodes], ledger, inventories)
            await asyncio.sleep(0)
