"""Per-shape node rankings kept up to date incrementally, so a decision costs the nodes that
changed since that pod shape was last placed, not a pass over the whole cluster.

A ``Ranking`` holds, for one pod shape, each node's latest plan and a max-heap of
``(-score, node index, node version)``. Binding a pod bumps the node's version and appends it
to the cluster's change log; a ranking replays the log since its last use, re-plans those
nodes and pushes fresh entries. Entries whose version is not the node's current one are stale
and dropped when they reach the top (a lazy-deletion heap), so a score may go up or down.
Ties at the top go to the smallest node index: with the nodes in a fixed random order, that
is the paper's simulator's rule; ``ties_at_top`` lists them all for random tie-breaking.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from rocshare.core.allocate import Plan

Entry = tuple[float, int, int]
"""(-score, node index, node version)."""


class Ranking:
    """The nodes ranked for one pod shape; ``plan_for(i)`` plans node i in its current state."""

    def __init__(self, size: int, plan_for: Callable[[int], Plan | None]) -> None:
        self.plan_for = plan_for
        self.plans: list[Plan | None] = [None] * size
        self.versions: list[int] = [-1] * size
        self.heap: list[Entry] = []
        self.log_position = 0
        self.fresh = True

    def refresh(self, versions: Sequence[int], log: Sequence[int]) -> None:
        """Re-plan every node whose version moved since this ranking last saw it."""
        if self.fresh:
            self.fresh = False
            self.log_position = len(log)
            self._plan_all(versions)
            return
        changed = set(log[self.log_position:])
        self.log_position = len(log)
        for i in changed:
            if self.versions[i] != versions[i]:
                self._replan(i, versions[i])

    def _plan_all(self, versions: Sequence[int]) -> None:
        # One heapify instead of a push per node: the first pod of a shape is the slow path.
        for i, version in enumerate(versions):
            plan = self.plans[i] = self.plan_for(i)
            self.versions[i] = version
            if plan is not None:
                self.heap.append((-plan.score, i, version))
        heapq.heapify(self.heap)

    def _replan(self, i: int, version: int) -> None:
        plan = self.plan_for(i)
        self.plans[i] = plan
        self.versions[i] = version
        if plan is not None:
            heapq.heappush(self.heap, (-plan.score, i, version))

    def top(self, versions: Sequence[int]) -> Entry | None:
        """The best live entry (smallest index among equal scores), or None if no node fits."""
        heap = self.heap
        while heap:
            entry = heap[0]
            if entry[2] == versions[entry[1]] and self.plans[entry[1]] is not None:
                return entry
            heapq.heappop(heap)
        return None

    def ties_at_top(self, versions: Sequence[int]) -> list[int]:
        """Every node sharing the best score (popped, then pushed back)."""
        first = self.top(versions)
        if first is None:
            return []
        taken: list[Entry] = []
        while (entry := self.top(versions)) is not None and entry[0] == first[0]:
            taken.append(heapq.heappop(self.heap))
        for entry in taken:
            heapq.heappush(self.heap, entry)
        return [entry[1] for entry in taken]
