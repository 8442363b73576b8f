"""What keeps pools and shares current: Nodes, AmdGpuNodes, pods and ResourceClaims (from the
process's cluster feed) and the DaemonSets the operator owns (from Kopf).

A ResourceClaim of rocshare's DRA driver is counted in the process's one hold index like a pod
(rocshare_operator/holds.py), so pool and share status, quota and metrics count DRA shares as
they count the device plugin's.

Each handler wakes only the loops whose inputs changed; an event that changes nothing
they read (a kubelet heartbeat, an agent heartbeat, a pod status tick) wakes nobody.
Node marks are written by the pool loops alone: a node whose labels or marks changed
wakes the loops of the pools it names or that select it (and loops that have not run
yet); each brings the nodes it concerns in line with the one membership rule.
"""

from __future__ import annotations

from typing import Any

import kopf

from rocshare_operator.reconcilers import shares
from rocshare_operator.reconcilers.agent_daemonset import AGENT_NAME
from rocshare.core.holdings import Holding
from rocshare.core.ids import PodKey
from rocshare_operator.holds import Accounts
from rocshare_operator.feed.cluster_facts import ClaimFacts, GpuNodeFacts, NodeFacts
from rocshare_operator.context import USAGE, LoopState, OperatorContext, pool_key
from rocshare_operator.status.pool_logic import NodeView
from rocshare_operator.status.pool_status import Inventory
from rocshare_operator.status.usage import PodSlices


def subscribe(ctx: OperatorContext) -> None:
    """Have the cluster feed tell the reconcilers about nodes, pods and share quotas (before the feed
    runs). What pods hold comes from the process's one hold index (`ctx.accounts`): the reconcilers'
    own, fed by the pod watch here, until the extender shares its own (`share_accounts`)."""
    own = Accounts(lambda node: _cu_counts(ctx, node))
    use_accounts(ctx, own)
    ctx.feed.subscribe(on_node=lambda kind, facts, before: node_changed(ctx, kind, facts, before),
                       on_gpu_node=lambda kind, facts, before: gpu_node_changed(ctx, kind, facts, before),
                       on_pod=lambda kind, facts, _before: own.on_pod(kind, facts) if ctx.accounts is own else None,
                       on_quota=lambda kind, facts, _before: shares.quota_changed(ctx, kind, facts),
                       on_claim=lambda kind, facts, _before: claim_changed(ctx, kind, facts),
                       on_failing=lambda: ctx.wakeups.wake_kind("pool"))  # their Degraded shows it


def node_changed(ctx: OperatorContext, kind: str, facts: NodeFacts, before: NodeFacts | None) -> None:
    """Labels or marks changed: wake the pools this node may join, leave or be marked for."""
    was = before.view if before is not None else None
    now = None if kind == "DELETED" else facts.view
    if was == now:
        return  # only allocatable changed: the extender reads it, pools do not
    ctx.wakeups.wake_where("pool", lambda key, state: _concerns(key[1], state, was, now))


def _concerns(pool: str, state: LoopState, *views: NodeView | None) -> bool:
    if state.view is None:  # not reconciled yet: it will read the node anyway, but let it know
        return True
    return any(view is not None and (view.marks.pool == pool or state.view.selects(view.label_map))
               for view in views)


def gpu_node_changed(ctx: OperatorContext, kind: str, facts: GpuNodeFacts, before: GpuNodeFacts | None) -> None:
    """The agent published: wake the node's pool when the GPUs it lists changed."""
    was = None if before is None else Inventory.of(before)
    now = None if kind == "DELETED" else Inventory.of(facts)
    if was != now:
        _wake_pool_of_node(ctx, facts.name)
        ctx.wakeups.wake_kind("share")  # cores percent depends on the GPUs' CU counts
        for claim in ctx.feed.claims_on(facts.name):  # their devices are read against the node's GPUs
            claim_changed(ctx, "MODIFIED", claim)


def claim_changed(ctx: OperatorContext, kind: str, facts: ClaimFacts) -> None:
    """A claim of rocshare's driver was allocated, prepared, freed or deleted: the hold index
    accounts it (holds.Accounts.claim_changed) against its node's GPUs."""
    ctx.accounts.claim_changed(kind, facts, ctx.feed.gpu_node(facts.node), ctx.feed.node(facts.node))


def use_accounts(ctx: OperatorContext, accounts: Accounts) -> None:
    """Derive status's slices from `accounts`, the process's one hold index (the extender calls this
    with its own before the feed runs; the reconcilers' own then hears no more pods)."""
    ctx.accounts = accounts
    accounts.on_hold.append(lambda key, namespace, holding: hold_changed(ctx, key, namespace, holding)
                            if ctx.accounts is accounts else None)


def hold_changed(ctx: OperatorContext, key: PodKey, namespace: str, holding: Holding | None) -> None:
    """A slice appeared, changed or was released: wake its node's pool and its namespace's shares."""
    name = key.partition("/")[2]
    held = None if holding is None else PodSlices(namespace, name, holding)
    before = ctx.slices.put(namespace, name, held)
    if before == held:
        return
    for slices in (before, held):
        if slices is not None and slices.node:
            _wake_pool_of_node(ctx, slices.node, USAGE)
    ctx.wakeups.wake_shares_in(namespace, USAGE)


def _cu_counts(ctx: OperatorContext, node: str) -> dict[str, int]:
    inventory = ctx.inventory(node)
    return inventory.cu_counts() if inventory is not None else {}


def _wake_pool_of_node(ctx: OperatorContext, node: str, reason: str = "") -> None:
    facts = ctx.feed.node(node)
    if facts is not None and facts.view.marks.pool:
        ctx.wakeups.wake(pool_key(facts.view.marks.pool), reason)


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

