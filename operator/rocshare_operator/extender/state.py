"""The scheduler's view of the cluster, rebuilt from watches (never the source of truth).

Fed by the operator's cluster feed (Nodes, Pods and AmdGpuNodes, watched once for the whole
process, as `NodeFacts`, `PodFacts` and `GpuNodeFacts`) and by informers on AmdGpuPools and
ResourceQuotas. It keeps only what decisions read: per node its facts (never the body),
per AmdGpuNode slotted `GpuFacts` (never the pydantic status), and the records in the ledger:
- per node, a `NodeInventory` from the agent's AmdGpuNode status and the pool settings
  the operator wrote on the Node (a node whose allocatable amd.com/gpu is 0, or that
  has no pool, offers nothing);
- the `Ledger`: every live pod's allocation record (the pod annotation), applied once,
  released when the pod ends or is deleted; an undecodable record is logged as an
  error and its pod is tracked in `broken_records` (its GPUs are unknown, so the node
  is treated as holding them: see `blocked_nodes`);
- per namespace, the amd.com limits of its ResourceQuotas;
- per node, the one in-flight pod (record written, agent not yet done) and a
  Condition that wakes binds waiting for it;
- `plans`: a memo of filter/prioritize answers per node (see `NodeMemo`), which never
  outlives the ledger version and inventory it was computed from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from collections.abc import Hashable
from typing import Any

from pydantic import ValidationError

from rocshare.api.allocation import AllocationError
from rocshare.api.models import AmdGpuPoolSpec, ShareLimits, Sharing
from rocshare.api.node_settings import SettingsError, decode_settings
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.quota import QuotaCost
from rocshare_operator.feed.cluster_facts import (
    GpuNodeFacts,
    NodeFacts,
    PodFacts,
    decoded_record,
    gpu_node_facts,
    node_facts,
    pod_facts,
)
from rocshare_operator.extender.quota import cu_totals_of, record_cost
from rocshare_operator.extender.retry import Retrier

log = logging.getLogger(__name__)

QUOTA_MEMORY = "limits.amd.com/gpumem"
QUOTA_CORES = "limits.amd.com/gpucores"
QUOTA_GPUS = "requests.amd.com/gpu"


@dataclass
class InFlight:
    pod: PodKey
    since_s: float


@dataclass(slots=True)
class KeyMemo:
    """One key's answers (see `NodeMemo`)."""

    by_node: dict[str, tuple[int, NodeInventory, Any]] = field(default_factory=dict)
    """Node name -> (its ledger version, its inventory, the answer computed from them)."""
    by_shape: dict[tuple, Any] = field(default_factory=dict)
    """(node shape, usage) -> the answer, for keys whose answers read no GPU id."""


class NodeMemo:
    """Answers of pure functions of (a node's inventory, its ledger usage, a key).

    `answers(key)` is one key's `KeyMemo`. A `by_node` entry is used only while the node's
    ledger version and `NodeInventory` object are the ones it was computed from (the ledger
    bumps the version on every apply or release on the node; a changed inventory is a new
    object): callers check both, in their own loop over thousands of nodes, and replace a
    stale entry. `by_shape` holds answers that depend only on a node's shape and usage (no
    GPU identity), so nodes alike share them. Nothing else is memoised here (quota, blocked
    nodes, in-flight pods are read fresh on every call). Bounded: past MAX_KEYS keys
    everything is dropped, past MAX_SHARED shape answers all of those; later calls refill.
    """

    MAX_KEYS = 64
    MAX_SHARED = 100_000

    def __init__(self) -> None:
        self._keys: dict[Hashable, KeyMemo] = {}
        self._shared = 0

    def answers(self, key: Hashable) -> KeyMemo:
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) >= self.MAX_KEYS:
                self.clear()
            found = self._keys[key] = KeyMemo()
        return found

    def share(self, memo: KeyMemo, shape_key: tuple, value: Any) -> None:
        if self._shared >= self.MAX_SHARED:
            for each in self._keys.values():
                each.by_shape.clear()
            self._shared = 0
        memo.by_shape[shape_key] = value
        self._shared += 1

    def forget(self, name: str) -> None:
        for memo in self._keys.values():
            memo.by_node.pop(name, None)

    def holds(self, name: str) -> bool:
        """Whether any key holds an answer for the node."""
        return any(name in memo.by_node for memo in self._keys.values())

    def clear(self) -> None:
        self._keys.clear()
        self._shared = 0


@dataclass
class SchedulerState:
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    gpu_status: dict[str, GpuNodeFacts] = field(default_factory=dict)
    """Node name -> its AmdGpuNode's GPUs (only nodes whose status was accepted)."""
    pools: dict[str, AmdGpuPoolSpec] = field(default_factory=dict)
    inventories: dict[str, NodeInventory] = field(default_factory=dict)
    node_pools: dict[str, str] = field(default_factory=dict)
    """Node name -> its pool label (an index of nodes, read once per node per decision)."""
    plans: NodeMemo = field(default_factory=NodeMemo)
    ledger: Ledger = field(default_factory=Ledger)
    pod_nodes: dict[PodKey, str] = field(default_factory=dict)
    pod_costs: dict[PodKey, tuple[str, QuotaCost]] = field(default_factory=dict)
    namespace_costs: dict[str, QuotaCost] = field(default_factory=dict)
    broken_records: dict[PodKey, str] = field(default_factory=dict)
    quotas: dict[str, dict[str, ShareLimits]] = field(default_factory=dict)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    settings_problems: dict[str, str] = field(default_factory=dict)
    status_problems: dict[str, str] = field(default_factory=dict)
    retrier: Retrier | None = None
    scheduler_name: str = "rocshare-scheduler"

    # ---- nodes and inventory ------------------------------------------------------------

    def on_node(self, kind: str, node: dict[str, Any]) -> None:
        """A Node object (tests, benches); the operator feeds `on_node_facts` from its one node watch."""
        self.on_node_facts(kind, node_facts(node))

    def on_node_facts(self, kind: str, node: NodeFacts, _before: NodeFacts | None = None) -> None:
        name = node.name
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.node_pools.pop(name, None)
        else:
            self.nodes[name] = node
            pool = node.view.marks.pool
            if pool:
                self.node_pools[name] = pool
            else:
                self.node_pools.pop(name, None)
        self._rebuild_inventory(name)

    def on_gpu_node(self, kind: str, obj: dict[str, Any]) -> None:
        """An AmdGpuNode object (tests, benches); the operator feeds `on_gpu_node_facts` from its one watch."""
        self.on_gpu_node_facts(kind, gpu_node_facts(obj))

    def on_gpu_node_facts(self, kind: str, facts: GpuNodeFacts, _before: GpuNodeFacts | None = None) -> None:
        name = facts.name
        if kind == "DELETED" or facts.gpus is None:
            if kind != "DELETED" and facts.problem:
                log.error("AmdGpuNode %s has an %s; ignoring its GPUs", name, facts.problem)
            self.gpu_status.pop(name, None)
        else:
            self._accept_status(name, facts)
        self._rebuild_inventory(name)

    def _accept_status(self, name: str, status: GpuNodeFacts) -> None:
        """A GPU listed twice would be offered twice (double its memory and CUs, or one pod handed
        the same device twice): the node offers nothing until its status is fixed."""
        seen: set[str] = set()
        repeated = sorted({gpu.id for gpu in status.gpus or () if gpu.id in seen or seen.add(gpu.id)})
        if not repeated:
            self.status_problems.pop(name, None)
            self.gpu_status[name] = status
            return
        problem = f"lists GPU {', '.join(repeated)} more than once"
        if self.status_problems.get(name) != problem:
            log.error("AmdGpuNode %s %s; ignoring its GPUs until its agent publishes each once", name, problem)
        self.status_problems[name] = problem
        self.gpu_status.pop(name, None)

    def on_pool(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pools.pop(name, None)
            return
        try:
            self.pools[name] = AmdGpuPoolSpec.model_validate(obj.get("spec", {}))
        except ValidationError as error:
            log.error("AmdGpuPool %s has an invalid spec: %s", name, error.errors()[0])

    def pool_of(self, node_name: str) -> AmdGpuPoolSpec | None:
        pool = self.node_pools.get(node_name)
        return self.pools.get(pool) if pool else None

    def _rebuild_inventory(self, name: str) -> None:
        node = self.nodes.get(name)
        status = self.gpu_status.get(name)
        if node is None or status is None or _allocatable_gpus(node) == 0:
            self.inventories.pop(name, None)
            self.plans.forget(name)
            return
        sharing = self._sharing_of(node)
        inventory = NodeInventory.from_gpu_infos(name, status.gpus or (), sharing)  # GpuFacts: GpuInfo's fields
        if inventory != self.inventories.get(name):
            self.inventories[name] = inventory
            if self.retrier is not None:
                # kube-scheduler may have retried on the node event before this cache saw it.
                self.retrier.room_freed()

    def _sharing_of(self, node: NodeFacts) -> Sharing:
        name = node.name
        text = node.view.marks.settings_json
        if text is None:
            return Sharing()
        try:
            settings = decode_settings(text)
        except SettingsError as error:
            if self.settings_problems.get(name) != str(error):
                log.error("node %s: %s; using default sharing settings", name, error)
            self.settings_problems[name] = str(error)
            return Sharing()
        self.settings_problems.pop(name, None)
        return settings.sharing

    # ---- pods and the ledger -------------------------------------------------------------

    async def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """A Pod object (tests, benches); the operator feeds `on_pod_facts` from its one pod watch."""
        await self.on_pod_facts(kind, pod_facts(pod))

    async def on_pod_facts(self, kind: str, pod: PodFacts, _before: PodFacts | None = None) -> None:
        key = pod.key
        ended = kind == "DELETED" or pod.finished
        if self.retrier is not None:
            self._track_waiting(key, pod, ended)
        if ended:
            await self._forget(key)
            return
        if pod.allocation is None:
            # Bind writes the record and the node in one Binding, and nothing removes a record from
            # a live pod: an event without one predates the Binding (the watch lags behind bind).
            return
        if key not in self.ledger and key not in self.broken_records:
            self._remember(key, pod.namespace, pod.allocation, pod.node)
        node = self.pod_nodes.get(key)
        if node and not _awaiting_allocation(pod):
            await self.release_inflight(node, key)
        elif node and pod.node == node and node not in self.inflight:
            # Bound before this process started (or its bind's own mark was lost): still in
            # flight, so no second pod may be bound to the node until the agent serves this one.
            self.inflight[node] = InFlight(key, time.monotonic())

    def _track_waiting(self, key: PodKey, pod: PodFacts, ended: bool) -> None:
        """Pods of our scheduler that kube-scheduler found unschedulable -- by its own filters too
        (e.g. Insufficient amd.com/gpu while a node's GPUs were down) -- are retried when room appears."""
        if ended or pod.node or pod.scheduler_name != self.scheduler_name:
            self.retrier.forget(key)
            return
        if pod.unschedulable is not None:
            self.retrier.note_waiting(key, pod.namespace)

    def _remember(self, key: PodKey, namespace: str, text: str, node_name: str) -> None:
        try:
            record = decoded_record(text)
        except AllocationError as error:
            # Never "free": the GPUs it names are unknown, so its node stays blocked.
            log.error("pod %s: %s; its node takes no new pods until the pod ends", key, error)
            self.broken_records[key] = str(error)
            self.pod_nodes[key] = node_name
            return
        self.commit(key, namespace, record)

    async def _forget(self, key: PodKey) -> None:
        self.broken_records.pop(key, None)
        node = self.pod_nodes.pop(key, None)
        self._uncount(key)
        released = key in self.ledger and self.ledger.release(key) is not None
        if node:
            await self.release_inflight(node, key)
        if released:
            if self.retrier is not None:
                self.retrier.room_freed()
            async with self.changed:
                self.changed.notify_all()

    def commit(self, key: PodKey, namespace: str, record) -> None:
        """Account a decision the moment bind writes it, before the watch echoes it back."""
        if key in self.ledger:
            return
        self.ledger.apply(record, key)
        self.pod_nodes[key] = record.node
        cost = record_cost(record, cu_totals_of(self.inventories.get(record.node)))
        self.pod_costs[key] = (namespace, cost)
        self.namespace_costs[namespace] = self.namespace_costs.get(namespace, QuotaCost()) + cost

    def _uncount(self, key: PodKey) -> None:
        namespace, cost = self.pod_costs.pop(key, ("", None))
        if cost is not None:
            held = self.namespace_costs[namespace]
            self.namespace_costs[namespace] = QuotaCost(held.memory_mib - cost.memory_mib,
                                                        held.cores_pct - cost.cores_pct, held.gpus - cost.gpus)

    async def uncommit(self, key: PodKey) -> None:
        await self._forget(key)

    def blocked_nodes(self) -> set[str]:
        return {self.pod_nodes.get(key, "") for key in self.broken_records} - {""}

    # ---- in-flight gate ------------------------------------------------------------------

    async def release_inflight(self, node: str, key: PodKey) -> None:
        current = self.inflight.get(node)
        if current is not None and current.pod == key:
            del self.inflight[node]
            async with self.changed:
                self.changed.notify_all()

    # ---- quotas ----------------------------------------------------------------------------

    def on_quota(self, kind: str, quota: dict[str, Any]) -> None:
        meta = quota["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        per_namespace = self.quotas.setdefault(namespace, {})
        if self.retrier is not None:
            self.retrier.quota_changed(namespace)
        if kind == "DELETED":
            per_namespace.pop(name, None)
            return
        hard = quota.get("spec", {}).get("hard", {})
        per_namespace[name] = ShareLimits(
            memory_mib=_quantity_int(hard.get(QUOTA_MEMORY)),
            cores_pct=_quantity_int(hard.get(QUOTA_CORES)),
            gpus=_quantity_int(hard.get(QUOTA_GPUS)),
        )

    def quota_limits(self, namespace: str) -> ShareLimits:
        limits = list(self.quotas.get(namespace, {}).values())
        return ShareLimits(
            memory_mib=_tightest(limit.memory_mib for limit in limits),
            cores_pct=_tightest(limit.cores_pct for limit in limits),
            gpus=_tightest(limit.gpus for limit in limits),
        )


def quota_facts(quota: dict[str, Any]) -> dict[str, Any]:
    """What `on_quota` reads of a ResourceQuota: its name and spec.hard (not status.used, which
    the quota controller rewrites on every pod the namespace starts)."""
    meta = quota.get("metadata") or {}
    return {"metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", "")},
            "spec": {"hard": dict((quota.get("spec") or {}).get("hard") or {})}}


def _awaiting_allocation(pod: PodFacts) -> bool:
    """Not yet served by the node's agent: the agent's own test (nodeagent inflight.py). A pod the
    kubelet started (Running) was served even when the agent's mark never landed."""
    return not pod.allocated and not pod.deleting and pod.phase == "Pending"


def _tightest(values) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _quantity_int(value: Any) -> int | None:
    """ResourceQuota hard values for amd.com are plain integers (MiB, percent, count)."""
    if value is None:
        return None
    text = str(value)
    for suffix, factor in (("k", 1000), ("M", 1000**2), ("Ki", 1024), ("Mi", 1024**2)):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        log.error("quota value %r is not an integer >= 0; ignoring it", value)
        return None
    return number


def _allocatable_gpus(node: NodeFacts) -> int | None:
    return None if node.gpus_allocatable is None else _quantity_int(node.gpus_allocatable)
