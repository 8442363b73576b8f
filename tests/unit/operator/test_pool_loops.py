"""The pool loops run from the cluster feed's one AmdGpuPool watch (reconcilers/pool_loops.py):
the finalizer goes on before the first pass and comes off only after the nodes are released,
both writes guarded by the pool's resourceVersion; a standby replica runs no loop until it
leads; a pass that fails is retried, not the end of the loop.

Every assert that nothing was written first waits for a positive signal that the writer would
have acted by then (the loops hold the pool's newest body; a loop's task has ended cleanly), and
checks that no task crashed: a crashed loop writes nothing either (`test_a_crashed_..._fails_the_mended_one`
plant one and show that the old form -- a sleep, then gather(return_exceptions=True) -- passed it).

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


async def running(kube: WritingKube, *, leading: bool = True) -> tuple[Any, list[asyncio.Task], PoolLoops]:
    ctx = operator_context(kube)
    ctx.gate.leading = leading
    loops = PoolLoops(ctx)
    ctx.feed.subscribe(on_pool=loops.on_pool)
    tasks = [asyncio.create_task(ctx.feed.run(), name="feed"), asyncio.create_task(loops.run(), name="loops")]
    await ctx.feed.wait_synced()
    await settle()
    return ctx, tasks, loops


def alive(tasks: list[asyncio.Task]) -> None:
    """The feed and the loops' driver still run (they end only when cancelled): raises what ended one."""
    for task in tasks:
        if task.done():
            raise AssertionError(f"{task.get_name()} ended: {task.exception()!r}") from task.exception()


async def stop(tasks: list[asyncio.Task]) -> None:
    """Cancel, then raise the first exception a task had ended with (never swallowed)."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [result for result in results if isinstance(result, Exception)]
    if failures:
        raise failures[0]


def holds(loops: PoolLoops, version: str) -> bool:
    """The positive signal that the loops took an event: they hold the pool's body at `version`."""
    return loops._bodies.get("p", {}).get("metadata", {}).get("resourceVersion") == version


def loop_ended_cleanly(loops: PoolLoops) -> bool:
    """The pool's loop ran and returned (raises what it crashed with)."""
    running_loop = loops._loops.get("p")
    if running_loop is None or not running_loop[0].done():
        return False
    if running_loop[0].exception() is not None:
        raise AssertionError(f"the pool loop crashed: {running_loop[0].exception()!r}")
    return True


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
    ctx, tasks, _loops = await running(kube)
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
    ctx, tasks, loops = await running(kube, leading=False)
    try:
        await standby_wrote_nothing(kube, loops, tasks, version="1")
        ctx.gate.set_leading(True)
        await eventually(lambda: kube.finalizer_writes() and kube.node_writes())
        assert ctx.wakeups.get(("pool", "p")) is not None
        ctx.gate.set_leading(False)  # the scheduler's Lease moved away: the loop stops
        await eventually(lambda: ctx.wakeups.get(("pool", "p")) is None)
        writes = len(kube.writes)
        kube.push(POOLS, "MODIFIED", pool(version="2", finalizers=(FINALIZER,), deleting=True))
        await eventually(lambda: holds(loops, "2"))  # the deletion reached the loops ...
        await settle()
        alive(tasks)
        assert "p" not in loops._loops and len(kube.writes) == writes  # ... the leader releases it, not this standby
    finally:
        await stop(tasks)


async def test_a_failed_pass_is_retried_not_the_end_of_the_loop(monkeypatch) -> None:
    monkeypatch.setattr(pool_loops, "ERROR_PAUSE_S", 0.05)
    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    kube.fail_writes = 1  # the finalizer write meets a conflict (a newer version was on its way)
    _ctx, tasks, _loops = await running(kube)
    try:
        await eventually(lambda: len(kube.finalizer_writes()) == 2 and kube.node_writes())
    finally:
        await stop(tasks)


@pytest.mark.parametrize("finalizers", [(), ("someone-else",)])
async def test_a_deleted_pool_without_our_finalizer_is_left_alone(finalizers: tuple[str, ...]) -> None:
    kube = WritingKube({NODES: [node("n1", pool="p", gpu="amd")], POOLS: [pool(finalizers=finalizers, deleting=True)]})
    _ctx, tasks, loops = await running(kube)
    try:
        await left_alone(kube, loops, tasks)
    finally:
        await stop(tasks)


async def standby_wrote_nothing(kube: WritingKube, loops: PoolLoops, tasks: list[asyncio.Task], *,
                                version: str) -> None:
    """A standby took the pool (it holds its body) and started no loop for it, so wrote nothing."""
    await eventually(lambda: holds(loops, version))
    await settle()
    alive(tasks)
    assert not loops._loops and kube.writes == []


async def left_alone(kube: WritingKube, loops: PoolLoops, tasks: list[asyncio.Task]) -> None:
    """The pool's loop ran to its end without a write."""
    await eventually(lambda: loop_ended_cleanly(loops))
    alive(tasks)
    assert kube.writes == []


# ---- the planted faults: a crashed loop passed the old form of these checks -------------------------


async def old_form(kube: WritingKube, tasks: list[asyncio.Task]) -> None:
    """How the checks above read before issue 44: a sleep, a negative assert, a gather that kept
    what the tasks raised."""
    await asyncio.sleep(0.3)
    assert kube.writes == []
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_crashed_loop_driver_passed_the_old_standby_check_and_fails_the_mended_one(monkeypatch) -> None:
    async def crashed(_self) -> None:
        raise RuntimeError("planted: the loops' driver crashed")

    monkeypatch.setattr(PoolLoops, "run", crashed)
    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    _ctx, tasks, _loops = await running(kube, leading=False)
    await old_form(kube, tasks)  # passes: nothing wrote, and the crash was gathered away

    kube = WritingKube({NODES: [node("n1", pool=None, gpu="amd")], POOLS: [pool()]})
    _ctx, tasks, loops = await running(kube, leading=False)
    try:
        with pytest.raises(AssertionError, match="planted: the loops' driver crashed"):
            await standby_wrote_nothing(kube, loops, tasks, version="1")
    finally:
        with pytest.raises(RuntimeError, match="planted"):
            await stop(tasks)  # the mended stop raises it too


async def test_a_crashed_pool_loop_passed_the_old_left_alone_check_and_fails_the_mended_one(monkeypatch) -> None:
    async def crashed(*_args: Any) -> None:
        raise RuntimeError("planted: the pool loop crashed")

    monkeypatch.setattr(pool_loops, "wait_for_feed", crashed)
    kube = WritingKube({NODES: [node("n1", pool="p", gpu="amd")], POOLS: [pool(deleting=True)]})
    _ctx, tasks, _loops = await running(kube)
    await old_form(kube, tasks)  # passes

    kube = WritingKube({NODES: [node("n1", pool="p", gpu="amd")], POOLS: [pool(deleting=True)]})
    _ctx, tasks, loops = await running(kube)
    try:
        with pytest.raises(AssertionError, match="planted: the pool loop crashed"):
            await left_alone(kube, loops, tasks)
    finally:
        await stop(tasks)
