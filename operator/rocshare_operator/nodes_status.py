"""Watches that keep pools and shares current: Nodes, AmdGpuNodes, pods, and the
DaemonSets the operator owns.

A Node whose labels change is brought in line here at once (the same pure rule the
pool loops use), which also removes marks of pools that no longer exist. Every
handler then wakes only the loops whose inputs changed; an event that changes
nothing they read (a kubelet heartbeat, an agent heartbeat, a pod status tick)
wakes nobody.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from rocshare.api.models import GROUP, VERSION
from rocshare.kube.client import ApiError
from rocshare_operator.agent_daemonset import AGENT_NAME
from rocshare_operator.context import OperatorContext, pool_key, share_key
from rocshare_operator.indexes import all_values, one_value
from rocshare_operator.pool_logic import NodeView, desired_node_patch, node_view, owning_pool
from rocshare_operator.pool_status import Inventory
from rocshare_operator.pools import patch_node
from rocshare_operator.usage import gpu_summaries, pod_slices


@kopf.on.event("v1", "nodes")
async def node_event(event: kopf.RawEvent, name: str, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger,
                     pool_views: kopf.Index, **_: Any) -> None:
    ctx: OperatorContext = memo.rocshare
    deleted = event["type"] == "DELETED"
    view = None if deleted else node_view(body)
    before: NodeView | None = ctx.seen.get(("node", name))
    if not ctx.changed(("node", name), view):
        return
    pools = all_values(pool_views)
    if view is not None:
        patch = desired_node_patch(view, pools)
        if patch is not None:
            try:
                await patch_node(ctx, name, patch, logger=logger)
            except ApiError as error:
                raise kopf.TemporaryError(f"marking node {name}: {error}", delay=2.0) from error
    for pool in _pools_concerned(before, view, pools):
        ctx.wakeups.wake(pool_key(pool))


def _pools_concerned(before: NodeView | None, after: NodeView | None, pools: list) -> set[str]:
    """Pools whose membership, conflicts or totals may change with this node."""
    names = set()
    for view in (before, after):
        if view is None:
            continue
        if view.marks.pool:
            names.add(view.marks.pool)
        names.update(pool.name for pool in pools if pool.selects(view.label_map))
        owner = owning_pool(view.label_map, pools)
        if owner:
            names.add(owner.name)
    return names


@kopf.on.event(GROUP, VERSION, "amdgpunodes")
def inventory_event(event: kopf.RawEvent, name: str, status: kopf.Status, memo: kopf.Memo,
                    node_views: kopf.Index, **_: Any) -> None:
    """The agent published: wake the node's pool when the GPUs it lists changed."""
    ctx: OperatorContext = memo.rocshare
    gpus = None if event["type"] == "DELETED" else Inventory(name, gpu_summaries(status.get("gpus") or []))
    if ctx.changed(("inventory", name), gpus):
        _wake_pool_of_node(ctx, node_views, name)
        ctx.wakeups.wake_kind("share")  # cores percent depends on the GPUs' CU counts


@kopf.on.event("v1", "pods")
def pod_event(event: kopf.RawEvent, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo,
              node_views: kopf.Index, shares_by_pool: kopf.Index, **_: Any) -> None:
    """A slice appeared, changed or was released: wake its node's pool and its namespace's shares."""
    ctx: OperatorContext = memo.rocshare
    held = None if event["type"] == "DELETED" else pod_slices(body)
    before = ctx.seen.get(("pod", namespace, name))
    if not ctx.changed(("pod", namespace, name), held):
        return
    for slices in (before, held):
        if slices is not None and slices.node:
            _wake_pool_of_node(ctx, node_views, slices.node)
    for share_namespace, share in all_values(shares_by_pool):
        if share_namespace == namespace:
            ctx.wakeups.wake(share_key(share_namespace, share))


def _wake_pool_of_node(ctx: OperatorContext, node_views: kopf.Index, node: str) -> None:
    view = one_value(node_views, node)
    if view is not None and view.marks.pool:
        ctx.wakeups.wake(pool_key(view.marks.pool))


@kopf.on.event("apps", "v1", "daemonsets",
               labels={"app.kubernetes.io/managed-by": "rocshare-operator", "app.kubernetes.io/name": AGENT_NAME})
def daemonset_event(event: kopf.RawEvent, body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo,
                    **_: Any) -> None:
    """Someone deleted or edited an agent DaemonSet: have its pool apply it again."""
    ctx: OperatorContext = memo.rocshare
    pool = labels.get("app.kubernetes.io/instance")
    state = ctx.wakeups.get(pool_key(pool)) if pool and namespace == ctx.agent.namespace else None
    if state is None:
        return
    generation = body.get("metadata", {}).get("generation")
    if event["type"] == "DELETED" or generation != state.applied.get("daemonset_generation"):
        ctx.wakeups.wake(pool_key(pool), "daemonset")

