"""One reconcile loop per AmdGpuPool, and the pool's finalizer, run from the process's one
AmdGpuPool watch (the cluster feed's `pools` Informer).

Why not Kopf's daemons and delete handler, as the shares have: the extender reads pools too,
and must keep reading them in a standby replica, whose Kopf is paused by peering (leadership.py)
-- a paused Kopf closes its watches. So the pool watch is the project's own `Informer`, which
the extender needs anyway (continuity: `synced` after the first full list; paging; decode
failures kept in `failing`; backoff: see rocshare/kube/informer.py), and these loops hang off
it instead of off a second watch of the same kind.

Invariants:
* A loop runs for each pool while this replica is active: always, unless it follows
  kube-scheduler's Lease, then while its scheduler leads (`DecisionGate.leading`) -- where
  Kopf, following the same Lease through its peering priority, runs the share loops.
* An active replica puts FINALIZER on each pool before its first pass, so a pool cannot go
  before its nodes are released; a pool being deleted gets its nodes released, then the
  finalizer removed. Both writes carry the resourceVersion they were computed from (a
  conflict means a newer event is on its way, and the loop tries again).
* Each pass reads the pool's latest body, and every other pool's view, from this module's
  copy of the watch (updated before any loop is woken); a pass that fails is retried after
  ERROR_PAUSE_S, each failure logged -- the loop never ends while the pool exists.
* Any pool event wakes every pool loop (a pool's change may move nodes between pools).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rocshare.api.models import API_VERSION
from rocshare.kube.client import ApiError, object_path
from rocshare_operator.context import LoopState, OperatorContext, pool_key
from rocshare_operator.reconcilers.pools import (
    ERROR_PAUSE_S,
    RESYNC_S,
    reconcile_pool,
    release_nodes,
    sleep_until_woken,
    wait_for_feed,
)
from rocshare_operator.status.pool_logic import PoolView, pool_view

log = logging.getLogger(__name__)

FINALIZER = "rocshare.io/operator"


class StopFlag(asyncio.Event):
    """An event that is false until set, as Kopf's DaemonStopped is (the loops' helpers test both)."""

    def __bool__(self) -> bool:
        return self.is_set()


def finalizers_patch(body: dict[str, Any], *, keep: bool) -> dict[str, Any] | None:
    """The merge patch that adds (`keep`) or removes FINALIZER, guarded by the body's
    resourceVersion; None when there is nothing to change."""
    meta = body.get("metadata", {})
    finalizers = list(meta.get("finalizers") or [])
    if (FINALIZER in finalizers) == keep:
        return None
    finalizers = [*finalizers, FINALIZER] if keep else [item for item in finalizers if item != FINALIZER]
    return {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}


class PoolLoops:
    """Subscribes to the feed's pool events (`on_pool`) and runs one loop per pool while active."""

    def __init__(self, ctx: OperatorContext) -> None:
        self._ctx = ctx
        self._bodies: dict[str, dict[str, Any]] = {}
        self._loops: dict[str, tuple[asyncio.Task, StopFlag]] = {}

    def others(self, name: str) -> list[PoolView]:
        return [pool_view(body) for other, body in self._bodies.items() if other != name]

    def on_pool(self, kind: str, body: dict[str, Any], _before: dict[str, Any] | None) -> None:
        name = body.get("metadata", {}).get("name", "")
        if kind == "DELETED":
            self._bodies.pop(name, None)
            self._stop(name)
        else:
            self._bodies[name] = body
            if self._active():
                self._start(name)
        self._ctx.wakeups.wake_kind("pool")

    async def run(self) -> None:
        """Until cancelled: start or stop every loop as this replica becomes active or not."""
        try:
            while True:
                for name in list(self._bodies):
                    if self._active():
                        self._start(name)
                    else:
                        self._stop(name)
                await self._ctx.gate.wait_changed()
        finally:  # the process is stopping: a pass under way is cut short (every write is idempotent)
            for task, stopped in self._loops.values():
                stopped.set()
                task.cancel()
            self._loops.clear()

    def _active(self) -> bool:
        return self._ctx.gate.leading

    def _start(self, name: str) -> None:
        running = self._loops.get(name)
        if running is not None and not running[0].done():
            return
        stopped = StopFlag()
        task = asyncio.create_task(self._loop(name, stopped), name=f"pool-loop-{name}")
        self._loops[name] = (task, stopped)

    def _stop(self, name: str) -> None:
        running = self._loops.pop(name, None)
        if running is not None:
            running[1].set()  # the loop leaves at its next wait; a pass under way finishes first

    async def _loop(self, name: str, stopped: StopFlag) -> None:
        state = self._ctx.wakeups.register(pool_key(name))
        logger = logging.LoggerAdapter(log, {"pool": name})
        try:
            await wait_for_feed(self._ctx, stopped)
            while not stopped:
                body = self._bodies.get(name)
                if body is None:
                    return
                try:
                    if await self._pass(name, body, state, logger=logger):
                        return
                    pause_s = RESYNC_S
                except Exception as error:  # a pass that failed is retried, never the end of the loop
                    log.error("pool %s: pass failed: %r; next pass in %.0f s", name, error, ERROR_PAUSE_S,
                              exc_info=not isinstance(error, ApiError))
                    pause_s = ERROR_PAUSE_S
                await sleep_until_woken(state, stopped, pause_s)
        finally:
            self._ctx.wakeups.unregister(pool_key(name), state)

    async def _pass(self, name: str, body: dict[str, Any], state: LoopState, *, logger: Any) -> bool:
        """One pass; True when the pool is released and the loop is done."""
        deleting = bool(body.get("metadata", {}).get("deletionTimestamp"))
        if deleting and FINALIZER not in (body.get("metadata", {}).get("finalizers") or []):
            return True  # not ours to hold back (or released already)
        if deleting:
            await release_nodes(self._ctx, body, others=self.others(name), logger=logger)
            self._ctx.wakeups.wake_kind("pool")
        patch = finalizers_patch(body, keep=not deleting)
        if patch is not None:
            await self._ctx.kube.merge_patch(object_path(API_VERSION, "amdgpupools", name), patch)
        if deleting:
            log.info("pool %s: nodes released, finalizer removed", name)
            return True
        await reconcile_pool(self._ctx, state, body, state.take_reasons(), others=self.others(name), logger=logger)
        return False
