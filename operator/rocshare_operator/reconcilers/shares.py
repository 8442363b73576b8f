"""AmdGpuShare handlers: the share's ResourceQuota and its status.

One reconcile loop per share (a Kopf daemon, woken by pods of its namespace through the
cluster feed, by AmdGpuNodes changing CU counts, and by edits to its quota). Each pass
server-side applies the quota when its intent changed, writes status when it differs, then the
quota's ``status.used`` entries Kubernetes does not count (the records' MiB and percent,
status.share_logic.quota_used) when they differ from what the quota says. The quota is owned by
the share, so it goes when the share goes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import kopf

from rocshare.api.models import API_VERSION, GROUP, VERSION, ShareLimits, ShareUsage
from rocshare.kube.client import ApiError, object_path
from rocshare_operator.context import LoopState, OperatorContext, share_key
from rocshare_operator.feed.cluster_facts import QuotaFacts
from rocshare_operator.reconcilers.pools import (
    ERROR_PAUSE_S,
    FIELD_MANAGER,
    RESYNC_S,
    now_rfc3339,
    sleep_until_woken,
    wait_for_feed,
)
from rocshare_operator.retrying import with_retries
from rocshare_operator.status.share_logic import (quota_body, quota_name, quota_used, quota_used_differs,
                                                       share_status)


@kopf.on.event(GROUP, VERSION, "amdgpushares")
def share_event(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """The share changed (spec, or status written elsewhere): its loop reads the live body again."""
    memo.rocshare.wakeups.wake(share_key(namespace, name))


@kopf.daemon(GROUP, VERSION, "amdgpushares", cancellation_backoff=2.0, cancellation_timeout=5.0,
             backoff=ERROR_PAUSE_S)
async def share_loop(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                     logger: logging.Logger, **indexes: Any) -> None:
    ctx: OperatorContext = memo.rocshare
    key = share_key(namespace, name)
    state = ctx.wakeups.register(key)
    try:
        await wait_for_feed(ctx, stopped)
        while not stopped:
            reasons = state.take_reasons()
            try:
                await reconcile_share(ctx, state, body, reasons, logger=logger, **indexes)
                pause_s = RESYNC_S
            except ApiError as error:
                logger.error(f"reconciling share {namespace}/{name} failed: {error}; next pass in {ERROR_PAUSE_S}s")
                pause_s = ERROR_PAUSE_S
            await sleep_until_woken(state, stopped, pause_s)
    finally:
        ctx.wakeups.unregister(key, state)


async def reconcile_share(ctx: OperatorContext, state: LoopState, body: kopf.Body, reasons: set[str], *,
                          logger: logging.Logger, **_: Any) -> None:
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return
    spec = dict(body.get("spec") or {})
    limits = ShareLimits.model_validate(dict(spec.get("limits") or {}))
    await apply_quota(ctx, state, body, limits, force="quota" in reasons, logger=logger)
    pods = ctx.slices.in_namespace(meta["namespace"])
    previous = dict(body.get("status") or {})
    status = share_status(
        share=meta["name"], generation=meta.get("generation"), pods=pods,
        inventories={node: inventory for node in {pod.node for pod in pods} if (inventory := ctx.inventory(node))},
        previous_conditions=previous.get("conditions"), now=now_rfc3339(),
    )
    if status != previous:
        path = object_path(API_VERSION, "amdgpushares", meta["name"], namespace=meta["namespace"],
                           subresource="status")
        await with_retries(f"status of share {meta['name']}", lambda: ctx.kube.merge_patch(path, {"status": status}),
                           logger=logger)
    await mirror_used(ctx, meta, quota_used(limits, ShareUsage.model_validate(status["used"])), logger=logger)


async def mirror_used(ctx: OperatorContext, meta: dict, used: dict[str, str], *, logger: logging.Logger) -> None:
    """Write the quota's rocshare-counted ``status.used`` entries where the quota (as the feed last
    saw it) says otherwise. A merge patch: Kubernetes' own entries stay as they are."""
    name = quota_name(meta["name"])
    seen = ctx.feed.quotas.store.get(f"{meta['namespace']}/{name}")
    if not used or seen is None or not quota_used_differs(seen.used_limits, used):
        return
    path = object_path("v1", "resourcequotas", name, namespace=meta["namespace"], subresource="status")
    await with_retries(f"used of ResourceQuota {name}",
                       lambda: ctx.kube.merge_patch(path, {"status": {"used": used}}), logger=logger)


async def apply_quota(ctx: OperatorContext, state: LoopState, body: kopf.Body, limits: ShareLimits, *, force: bool,
                      logger: logging.Logger) -> None:
    meta = body["metadata"]
    quota = quota_body(share=meta["name"], namespace=meta["namespace"], uid=meta["uid"], limits=limits)
    fingerprint = json.dumps(quota, sort_keys=True)
    if not force and state.applied.get("quota") == fingerprint:
        return
    path = object_path("v1", "resourcequotas", quota["metadata"]["name"], namespace=meta["namespace"])
    await with_retries(f"ResourceQuota {quota['metadata']['name']}",
                       lambda: ctx.kube.apply(path, quota, field_manager=FIELD_MANAGER), logger=logger)
    state.applied["quota"] = fingerprint
    state.applied["quota_hard"] = quota["spec"]["hard"]


def quota_changed(ctx: OperatorContext, kind: str, quota: QuotaFacts) -> None:
    """Someone deleted or edited a share's quota (from the process's one quota watch, the cluster
    feed): have the share apply it again; its used entries changed: have the share check them."""
    if quota.share is None:
        return
    key = share_key(quota.namespace, quota.share)
    state = ctx.wakeups.get(key)
    if state is None:
        return
    if kind == "DELETED" or dict(quota.hard) != state.applied.get("quota_hard"):
        ctx.wakeups.wake(key, "quota")
    else:  # its facts changed otherwise: the rocshare-counted used entries, which the next pass checks
        ctx.wakeups.wake(key)
