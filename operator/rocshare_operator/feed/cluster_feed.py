"""One watch per kind for the whole operator process: Nodes, Pods, AmdGpuNodes,
ResourceQuotas, AmdGpuPools and ResourceClaims reach it here, once.

The extender's `SchedulerState` and the pool and share reconcilers all read these kinds.
Rather than each watching them (and decoding every event twice), the process runs one
informer per kind and fans each change out to its subscribers, in the order they
subscribed. The informers keep `NodeFacts`, `PodFacts`, `GpuNodeFacts`, `QuotaFacts` and
`ClaimFacts` (cluster_facts.py), not bodies, and drop events that change no fact (kubelet and agent
heartbeats, status ticks nobody reads), so a subscriber only hears of a change it could
notice. Every cache here is a `rocshare.kube.Informer`, the product's one list+watch (see its
docstring for why it and not Kopf's watcher). AmdGpuPools are kept as bodies (slimmed):
the extender's pool index and the pool reconcile loops (reconcilers/pool_loops.py, which
also run the pool's finalizer) read the same one watch. Kopf still watches the two kinds
nothing else here reads -- AmdGpuShares (their reconcile loops) and the agent DaemonSets --
so every kind is watched once per process (docs/reliability.md, "One watch per kind").

Subscribers join before the feed runs (`subscribe` refuses afterwards: a late reader
would miss the first list). Readers must not answer from the feed before `synced`: the
reconcilers wait for it, the extender reports not ready until then.

A handler that raises does not lose the event: every handler still sees it, and then the
informer keeps the event and hands it to every handler again with a backoff until all take
it (handlers are idempotent). Until then `failing()` lists it: the operator's readiness and
metrics report it, and the extender keeps whatever the pod may hold blocked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rocshare.api import dra
from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, object_path
from rocshare.kube.informer import Informer, object_key
from rocshare_operator.feed.cluster_facts import (
    ClaimFacts,
    GpuNodeFacts,
    NodeFacts,
    PodFacts,
    QuotaFacts,
    claim_facts,
    gpu_node_facts,
    node_facts,
    pod_facts,
    quota_facts,
)

log = logging.getLogger(__name__)

NodeHandler = Callable[[str, NodeFacts, NodeFacts | None], Awaitable[None] | None]
PodHandler = Callable[[str, PodFacts, PodFacts | None], Awaitable[None] | None]
GpuNodeHandler = Callable[[str, GpuNodeFacts, GpuNodeFacts | None], Awaitable[None] | None]
QuotaHandler = Callable[[str, QuotaFacts, QuotaFacts | None], Awaitable[None] | None]
ClaimHandler = Callable[[str, ClaimFacts, ClaimFacts | None], Awaitable[None] | None]
PoolHandler = Callable[[str, dict[str, Any], dict[str, Any] | None], Awaitable[None] | None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED", the facts now (last facts when deleted), the facts before)."""


class ClusterFeed:
    def __init__(self, kube: Kube) -> None:
        self._node_handlers: list[NodeHandler] = []
        self._pod_handlers: list[PodHandler] = []
        self._gpu_node_handlers: list[GpuNodeHandler] = []
        self._quota_handlers: list[QuotaHandler] = []
        self._pool_handlers: list[PoolHandler] = []
        self._claim_handlers: list[ClaimHandler] = []
        self._failing_handlers: list[Callable[[], None]] = []
        self._started = False
        self.nodes: Informer[NodeFacts] = Informer(kube, "/api/v1/nodes", self._on_node, name="nodes",
                                                   decode=node_facts, changed_only=True,
                                                   on_failing=self._failing_changed)
        self.pods: Informer[PodFacts] = Informer(kube, "/api/v1/pods", self._on_pod, name="pods",
                                                 decode=pod_facts, changed_only=True,
                                                 on_failing=self._failing_changed)
        self.gpu_nodes: Informer[GpuNodeFacts] = Informer(
            kube, object_path(API_VERSION, "amdgpunodes"), self._on_gpu_node, name="amdgpunodes",
            decode=gpu_node_facts, changed_only=True, on_failing=self._failing_changed)
        self.quotas: Informer[QuotaFacts] = Informer(kube, "/api/v1/resourcequotas", self._on_quota,
                                                     name="resourcequotas", decode=quota_facts, changed_only=True,
                                                     on_failing=self._failing_changed)
        self.pools: Informer[dict[str, Any]] = Informer(kube, object_path(API_VERSION, "amdgpupools"), self._on_pool,
                                                        name="amdgpupools", on_failing=self._failing_changed)
        self.claims: Informer[ClaimFacts] = Informer(
            kube, object_path(dra.RESOURCE_API_VERSION, "resourceclaims"), self._on_claim, name="resourceclaims",
            decode=claim_facts, changed_only=True, on_failing=self._failing_changed)

    def subscribe(self, *, on_node: NodeHandler | None = None, on_pod: PodHandler | None = None,
                  on_gpu_node: GpuNodeHandler | None = None, on_quota: QuotaHandler | None = None,
                  on_pool: PoolHandler | None = None, on_claim: ClaimHandler | None = None,
                  on_failing: Callable[[], None] | None = None) -> None:
        """`on_failing`: told when an object starts or stops failing (see `failing`)."""
        if self._started:
            raise RuntimeError("subscribe to the cluster feed before it runs: a late reader misses the first list")
        if on_failing is not None:
            self._failing_handlers.append(on_failing)
        for handlers, handler in ((self._node_handlers, on_node), (self._pod_handlers, on_pod),
                                  (self._gpu_node_handlers, on_gpu_node), (self._quota_handlers, on_quota),
                                  (self._pool_handlers, on_pool), (self._claim_handlers, on_claim)):
            if handler is not None:
                handlers.append(handler)

    def informers(self) -> tuple[Informer, ...]:
        return (self.nodes, self.gpu_nodes, self.quotas, self.pools, self.pods, self.claims)

    def _failing_changed(self) -> None:
        for handler in self._failing_handlers:
            handler()

    def failing(self) -> dict[str, str]:
        """Objects whose latest event a handler has not taken yet (or that cannot be decoded) -> why."""
        return {f"{informer.name} {key}": failure.error
                for informer in self.informers() for key, failure in informer.failing.items()}

    def failures_total(self) -> dict[str, int]:
        """Failed handler calls and decodes so far, per kind."""
        return {informer.name: informer.failures_total for informer in self.informers()}

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers())

    async def wait_synced(self) -> None:
        for informer in self.informers():
            await informer.synced.wait()

    def node(self, name: str) -> NodeFacts | None:
        return self.nodes.store.get(f"/{name}")

    def node_facts(self) -> list[NodeFacts]:
        return list(self.nodes.store.values())

    def gpu_node(self, name: str) -> GpuNodeFacts | None:
        return self.gpu_nodes.store.get(f"/{name}")

    def claims_on(self, node: str) -> list[ClaimFacts]:
        return [facts for facts in self.claims.store.values() if facts.ours and facts.node == node]

    def claims_in(self, namespace: str) -> list[ClaimFacts]:
        return [facts for facts in self.claims.store.values() if facts.ours and facts.namespace == namespace]

    async def run(self) -> None:
        """Run until cancelled. Nodes and AmdGpuNodes are listed before pods, so that readers
        know every node's GPUs when the pods' records and the claims' allocations arrive."""
        self._started = True
        await asyncio.gather(self.nodes.run(), self.gpu_nodes.run(), self.quotas.run(), self.pools.run(),
                             self._pods_after_nodes(), self._claims_after_nodes())

    async def _pods_after_nodes(self) -> None:
        await self.nodes.synced.wait()
        await self.gpu_nodes.synced.wait()
        await self.pods.run()

    async def _claims_after_nodes(self) -> None:
        await self.nodes.synced.wait()
        await self.gpu_nodes.synced.wait()
        await self.claims.run()

    # The informers still store the previous facts while their handler runs.

    async def _on_node(self, kind: str, facts: NodeFacts) -> None:
        await _fan_out(self._node_handlers, kind, facts, self.node(facts.name))

    async def _on_gpu_node(self, kind: str, facts: GpuNodeFacts) -> None:
        await _fan_out(self._gpu_node_handlers, kind, facts, self.gpu_node(facts.name))

    async def _on_quota(self, kind: str, facts: QuotaFacts) -> None:
        await _fan_out(self._quota_handlers, kind, facts, self.quotas.store.get(facts.key))

    async def _on_pool(self, kind: str, body: dict[str, Any]) -> None:
        await _fan_out(self._pool_handlers, kind, body, self.pools.store.get(object_key(body)))

    async def _on_pod(self, kind: str, facts: PodFacts) -> None:
        await _fan_out(self._pod_handlers, kind, facts, self.pods.store.get(facts.key))

    async def _on_claim(self, kind: str, facts: ClaimFacts) -> None:
        await _fan_out(self._claim_handlers, kind, facts, self.claims.store.get(facts.key))


class HandlersFailed(Exception):
    """Some handlers raised on an event (the others took it); the informer retries the event."""


async def _fan_out(handlers: list[Callable[..., Any]], kind: str, facts: Any, before: Any) -> None:
    """Every handler sees the change, even when an earlier one failed on it; then, if any failed,
    raise so that the informer keeps the event and retries it."""
    failed = []
    for handler in handlers:
        try:
            result = handler(kind, facts, before)
            if asyncio.iscoroutine(result):
                await result
        except Exception as error:  # one reader's bug must not starve the others
            failed.append(f"{getattr(handler, '__qualname__', handler)}: {error!r}")
    if failed:
        raise HandlersFailed("; ".join(failed))
