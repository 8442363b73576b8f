"""What one pass of an AmdGpuPool's reconcile loop does: mark the pool's nodes, run its
node agent, report its status -- and, when the pool goes, release its nodes.

The loops themselves (one per pool, and the pool's finalizer) are run by pool_loops.py from
the process's one AmdGpuPool watch; events elsewhere only wake them (see context.py). A pass
is idempotent: it computes the desired node marks, DaemonSet and status from every pool's
view and the cluster feed (nodes, AmdGpuNodes, pods' slices), and writes only what differs.
The DaemonSet goes with the pool through its owner reference.

`wait_for_feed` and `sleep_until_woken` are shared with the share loops (Kopf daemons): they
take anything that is false until the loop must stop and can be waited on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from rocshare.api.models import API_VERSION
from rocshare.kube.client import NotFound, object_path
from rocshare.kube.events import involved_object, post_event
from rocshare_operator.reconcilers.agent_daemonset import daemonset_name, render_daemonset
from rocshare_operator.context import LoopState, OperatorContext
from rocshare_operator.status.pool_logic import (
    PoolView,
    conflict_message,
    desired_marks,
    drain_message,
    node_patch,
    membership,
    nodes_to_reconcile,
    orphaned_nodes,
    pool_view,
)
from rocshare_operator.status.node_isolation import node_isolation
from rocshare_operator.status.pool_status import PoolFacts, pool_status
from rocshare_operator.retrying import with_retries

FIELD_MANAGER = "rocshare-operator"
RESYNC_S = 60.0  # a pass even when nothing woke the loop: repairs drift nobody told us about
ERROR_PAUSE_S = 5.0  # after a pass failed for good; the next pass retries
DEBOUNCE_S = 0.2  # let a burst of events land before reconciling once
COMPONENT = "rocshare-operator"


class Stopped(Protocol):
    """False until the loop must stop (kopf.DaemonStopped, pool_loops.StopFlag)."""

    def __bool__(self) -> bool: ...

    def wait(self) -> Any: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def wait_for_feed(ctx: OperatorContext, stopped: Stopped) -> None:
    """Until the cluster feed has listed every node and pod (or the loop is stopped)."""
    synced = asyncio.ensure_future(ctx.feed.wait_synced())
    stopping = asyncio.ensure_future(stopped.wait())
    await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (synced, stopping):
        task.cancel()


async def sleep_until_woken(state: LoopState, stopped: Stopped, timeout_s: float) -> None:
    """Sleep until woken, stopped (so Kopf never has to cancel the loop) or `timeout_s` passes. A wake
    for usage alone waits out the usage pace (context.USAGE_PASS_S) unless another wake comes first."""
    if not await _first(state.event, stopped, timeout_s):
        return
    await asyncio.sleep(DEBOUNCE_S)
    pace_s = state.usage_wait_s()
    if pace_s and not stopped:
        await _first(state.urgent, stopped, pace_s)


async def _first(event: asyncio.Event, stopped: Stopped, timeout_s: float) -> bool:
    """Wait for `event`, the loop's stop or `timeout_s`; True when `event` came first."""
    woken = asyncio.ensure_future(event.wait())
    stopping = asyncio.ensure_future(stopped.wait())
    done, pending = await asyncio.wait({woken, stopping}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return woken in done and not stopped


async def reconcile_pool(ctx: OperatorContext, state: LoopState, body: dict[str, Any], reasons: set[str], *,
                         others: list[PoolView], logger: logging.Logger) -> None:
    """One pass; `others`: every other pool's view."""
    view = state.view = pool_view(body)
    if view.deleting:
        return  # the finalizer releases the nodes (release_nodes)
    pools = [*others, view]
    nodes = ctx.node_views()
    draining = await mark_nodes(ctx, view, pools, nodes, logger=logger)
    if view.eligible:
        await apply_daemonset(ctx, state, body, force="daemonset" in reasons, logger=logger)
    member_of = membership(view, pools, nodes)
    facts = PoolFacts(
        generation=body.get("metadata", {}).get("generation"), members=member_of.members,
        conflicting=member_of.conflicting_nodes,
        inventories={node: inventory for node in member_of.members if (inventory := ctx.inventory(node))},
        pods_by_node={node: ctx.slices.on_node(node) for node in member_of.members},
        problem=view.problem, draining=tuple(sorted(draining)),
        events_failing=tuple(f"{what}: {why}" for what, why in sorted(ctx.feed.failing().items())),
    )
    previous = dict(body.get("status") or {})
    await announce_conflicts(ctx, body, view, member_of.conflicts, previous.get("conflictingNodes") or [])
    status = pool_status(facts, previous_conditions=previous.get("conditions"), now=now_rfc3339())
    if status != previous:
        path = object_path(API_VERSION, "amdgpupools", view.name, subresource="status")
        await with_retries(f"status of pool {view.name}", lambda: ctx.kube.merge_patch(path, {"status": status}),
                           logger=logger)
    for node in facts.members:
        await publish_isolation(ctx, state, node, logger=logger)


async def publish_isolation(ctx: OperatorContext, state: LoopState, node: str, *, logger: logging.Logger) -> None:
    """The node's AmdGpuNode status.isolation, by server-side apply with the operator's field manager
    (the agent applies the rest of status with its own, so neither removes the other's fields).
    Written again only when it changed or the AmdGpuNode's facts did (a re-created object among
    them): the loop remembers what it wrote against the facts object it read, so no event of its own
    write has to reach the extender, which rebuilds a node's inventory on each AmdGpuNode change."""
    gpu_node = ctx.feed.gpu_node(node)
    if gpu_node is None or gpu_node.gpus is None:
        return  # nothing published yet (or refused): no GPUs to lay pods on
    isolation = node_isolation(gpu_node.gpus, ctx.slices.on_node(node))
    fingerprint = json.dumps(isolation, sort_keys=True)
    written = state.applied.get(f"isolation/{node}")
    if written is not None and written[0] is gpu_node and written[1] == fingerprint:
        return
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": node},
            "status": {"isolation": isolation}}
    path = object_path(API_VERSION, "amdgpunodes", node, subresource="status")
    try:
        await with_retries(f"isolation of node {node}",
                           lambda: ctx.kube.apply(path, body, field_manager=FIELD_MANAGER), logger=logger)
    except NotFound:
        return  # the agent creates it again; a pass after that writes it
    state.applied[f"isolation/{node}"] = (gpu_node, fingerprint)


async def mark_nodes(ctx: OperatorContext, view: PoolView, pools: list[PoolView], nodes: list, *,
                     logger: logging.Logger) -> list[str]:
    """Label and annotate (or release) every node this pool selects or still marks, and unmark
    nodes marked for pools that no longer exist (no loop of theirs is left to do it). A node
    holding GPU pods keeps its operating mode until drained; those nodes are returned."""
    concerned = {node.name: node for node in nodes_to_reconcile(view, nodes) + orphaned_nodes(nodes, pools)}
    draining = []
    for node in concerned.values():
        desired = desired_marks(node, pools, busy=bool(ctx.slices.on_node(node.name)))
        if desired.pending_mode is not None:
            draining.append(node.name)
            if desired.pending_mode != node.marks.pending_mode:
                await announce_drain(ctx, node.name, desired, logger=logger)
        patch = node_patch(node.marks, desired)
        if patch is not None:
            await patch_node(ctx, node.name, patch, logger=logger)
    return draining


async def announce_drain(ctx: OperatorContext, node: str, marks, *, logger: logging.Logger) -> None:
    """A Warning event on the Node, once per pending switch."""
    message = drain_message(node, marks)
    logger.warning(message)
    await post_event(ctx.kube, {"apiVersion": "v1", "kind": "Node", "name": node}, reason="DrainRequired",
                     message=message, component=COMPONENT)


async def patch_node(ctx: OperatorContext, node: str, patch: dict, *, logger: logging.Logger) -> None:
    path = object_path("v1", "nodes", node)
    try:
        await with_retries(f"marks of node {node}", lambda: ctx.kube.merge_patch(path, patch), logger=logger)
        logger.info(f"node {node}: pool label set to {patch['metadata']['labels']}")
    except NotFound:
        pass  # the node is gone; nothing to mark


async def apply_daemonset(ctx: OperatorContext, state: LoopState, body: dict[str, Any], *, force: bool,
                          logger: logging.Logger) -> None:
    """Server-side apply the agent DaemonSet when its rendering changed (or someone changed it)."""
    daemonset = render_daemonset(body, ctx.agent)
    fingerprint = json.dumps(daemonset, sort_keys=True)
    if not force and state.applied.get("daemonset") == fingerprint:
        return
    name = daemonset_name(body["metadata"]["name"])
    path = object_path("apps/v1", "daemonsets", name, namespace=ctx.agent.namespace)
    applied = await with_retries(f"DaemonSet {name}",
                                 lambda: ctx.kube.apply(path, daemonset, field_manager=FIELD_MANAGER), logger=logger)
    state.applied["daemonset"] = fingerprint
    state.applied["daemonset_generation"] = applied.get("metadata", {}).get("generation")


async def announce_conflicts(ctx: OperatorContext, body: dict[str, Any], view: PoolView,
                             conflicts: tuple[tuple[str, str], ...], already_reported: list[str]) -> None:
    """A Warning event on this pool for each node newly held by an older pool, naming both pools."""
    for node, holder in conflicts:
        if node not in already_reported:
            await post_event(ctx.kube, involved_object(body), reason="NodeConflict",
                             message=conflict_message(node, holder=holder, loser=view.name), component=COMPONENT)


async def release_nodes(ctx: OperatorContext, body: dict[str, Any], *, others: list[PoolView],
                        logger: logging.Logger) -> None:
    """The pool is going: unmark its nodes (or hand them to the next pool that selects them)."""
    view = pool_view(body)  # deleting: it owns nothing any more
    await mark_nodes(ctx, view, [*others, view], ctx.node_views(), logger=logger)
