"""The pool loops run from the cluster feed's one AmdGpuPool watch (reconcilers/pool_loops.py):
the finalizer goes on before the first pass and comes off only after the nodes are released,
both writes guarded by the pool's resourceVersion; a standby replica runs no loop until it
leads; a pass that fails is retried, not the end of the loop.

The Kubernetes API is scripted here (tests/e2e/test_operator.py runs the same loops against the
real kube-apiserver: pool lifecycle, deletion, restart).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rocshare.api.models import API_VERSION
from rocshare.api.node_settings import POOL_LABEL
from rocshare.kube.client import Conflict, object_path
from rocshare_operator.reconcilers import pool_loops
from rocshare_operator.reconcilers.pool_loops import FINALIZER, PoolLoops, finalizers_patch
from tests.unit.operator.test_cluster_feed import NODES, POOLS, ScriptedKube, node, operator_context, settle

POOL_PATH = object_path(API_VERSION, "amdgpupools", "p")


def pool(*, version: str = "1", finalizers: tuple[str, ...] = (), deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z",
                            "resourceVersion": version, "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": meta, "spec": {"nodeSelector": {"gpu": "amd"}}}


class WritingKube(ScriptedKube):
    """The scripted lists and watches, and every write remembered (`fail_writes` raise Conflict)."""

    def __init__(self, objects: dict[str, list[dict]]) -> None:
        super().__init__(objects)
        self.writes: list[tuple[str, str, dict]] = []
        self.fail_writes = 0

    async def _write(self, verb: str, path: str, body: dict) -> dict:
        self.writes.append((verb, path, body))
        if self.fail_writes:
            self.fail_writes -= 1
            raise Conflict(409, "Conflict", "planted")
        return {"metadata": {"generation": 1}}

    async def merge_patch(self, path: str, patch: dict) -> dict:
        return await self._write("merge_patch", path, patch)

    async def apply(self, path: str, body: dict, **_: Any) -> dict:
        return await self._write("apply", path, body)

    async def create(self, path: str, body: dict) -> dict:
        return await self._write("create", path, body)

    def finalizer_writes(self) -> list[dict]:
        return [body["metadata"] for verb, path, body in self.writes
                if path == POOL_PATH and "finalizers" in body.get("metadata", {})]

    def node_writes(self) -> list[dict]:
        return [body for _verb, path, body in self.writes if path == object_path("v1", "nodes", "n1")]


async def running(kube: WritingKube, *, leading: bool = True):
    ctx = operator_context(kube)
    ctx.gate.leading = leading
    loops = PoolLoops(ctx)
    ctx.feed.subscribe(on_pool=loops.on_pool)
    tasks = [asyncio.create_task(ctx.feed.run()), asyncio.create_task(loops.run())]
    await ctx.feed.wait_synced()
    await settle()
    return ctx, tasks


async def stop(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def eventually(check, within_s: float = 3.0) -> None:
    for _ in range(int(within_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    assert check()


def test_the_finalizer_patch_adds_or_removes_only_ours_under_the_version_it_saw() -> None:
    assert finalizers_patch(pool(version="7", finalizers=("other",)), keep=True) == {
        "metadata": {"finalizers": ["other", FINALIZER], "resourceVersion": "7"}}
    assert finalizers_patch(pool(version="8", finalizers=("other", FINALIZER)), keep=False) == {
        "metadata": {"finalizers": ["other"], "resourceVersion": "8"}}
    assert finalizers_patch(pool(finalizers=(FINALIZER,)), keep=True) is None
    assert finalizers_patch(pool(), keep=False) is None


async def test_a_pool_gets_the_finalizer_then_its_nodes_are_released_before_it_comes_off(monkeypatch) -> None:
    monkeypatch.setattr(pool_loops, "RESYNC_S", 60.0)
    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    ctx, tasks = await running(kube)
    try:
        await eventually(lambda: kube.finalizer_writes() and kube.node_writes())
        assert kube.finalizer_writes()[0] == {"finalizers": [FINALIZER], "resourceVersion": "1"}
        assert kube.node_writes()[0]["metadata"]["labels"][POOL_LABEL] == "p"  # the pass ran after it
        # The node now carries the pool's marks (as the API server would report them).
        kube.push(NODES, "MODIFIED", {**node("n1", pool="p", gpu="amd")})
        kube.push(POOLS, "MODIFIED", pool(version="2", finalizers=(FINALIZER,), deleting=True))
        await eventually(lambda: len(kube.finalizer_writes()) == 2)
        unmarked = next(index for index, (_verb, path, body) in enumerate(kube.writes)
                        if path == object_path("v1", "nodes", "n1") and body["metadata"]["labels"][POOL_LABEL] is None)
        finalizer_off = next(index for index, (_verb, path, body) in enumerate(kube.writes)
                             if path == POOL_PATH and body.get("metadata", {}).get("finalizers") == [])
        assert unmarked < finalizer_off  # the nodes were released before the finalizer came off
        assert kube.finalizer_writes()[1] == {"finalizers": [], "resourceVersion": "2"}
        assert ("pool", "p") not in ctx.wakeups._loops  # the loop is done
    finally:
        await stop(tasks)


async def test_a_standby_replica_runs_no_loop_until_it_leads() -> None:
    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    ctx, tasks = await running(kube, leading=False)
    try:
        await asyncio.sleep(0.3)
        assert kube.writes == []
        ctx.gate.set_leading(True)
        await eventually(lambda: kube.finalizer_writes() and kube.node_writes())
        assert ctx.wakeups.get(("pool", "p")) is not None
        ctx.gate.set_leading(False)  # the scheduler's Lease moved away: the loop stops
        await eventually(lambda: ctx.wakeups.get(("pool", "p")) is None)
        writes = len(kube.writes)
        kube.push(POOLS, "MODIFIED", pool(version="2", finalizers=(FINALIZER,), deleting=True))
        await asyncio.sleep(0.3)
        assert len(kube.writes) == writes  # the leader releases it, not this standby
    finally:
        await stop(tasks)


async def test_a_failed_pass_is_retried_not_the_end_of_the_loop(monkeypatch) -> None:
    monkeypatch.setattr(pool_loops, "ERROR_PAUSE_S", 0.05)
    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    kube.fail_writes = 1  # the finalizer write meets a conflict (a newer version was on its way)
    _ctx, tasks = await running(kube)
    try:
        await eventually(lambda: len(kube.finalizer_writes()) == 2 and kube.node_writes())
    finally:
        await stop(tasks)


@pytest.mark.parametrize("finalizers", [(), ("someone-else",)])
async def test_a_deleted_pool_without_our_finalizer_is_left_alone(finalizers: tuple[str, ...]) -> None:
    kube = WritingKube({NODES: [node("n1", pool="p", gpu="amd")], POOLS: [pool(finalizers=finalizers, deleting=True)]})
    _ctx, tasks = await running(kube)
    try:
        await asyncio.sleep(0.3)
        assert kube.writes == []
    finally:
        await stop(tasks)
