"""The scheduler's view of the cluster, in parts with one job each, and the snapshot
decisions read.

* `ClusterIndex` (index.py): nodes, their GPUs, pools and quotas, fed by events;
* `Accounts` (rocshare_operator/holds.py): the ledger of what every live pod holds, the namespaces' used
  figures, the pods that cannot be accounted for, and the in-flight gate that bind acquires
  and the pod watch releases;
* `NodeMemo` (plans.py): the plan cache, which owns the rule for when an answer is valid;
* `FleetArrays` (rocshare.core.fleet): every node's loads as arrays, which the bulk planner reads
  (it follows the ledger's journal itself).

`SchedulerState` wires them to the cluster feed (Nodes, Pods, AmdGpuNodes and ResourceQuotas,
watched once for the process) and to the retrier; `snapshot()` is what filter, prioritize and bind's decision
read. A snapshot is taken on the event loop and used without awaiting, so no event changes it
during a decision. Decisions return answers; side effects (binding, in-flight marks, retries,
metrics) happen in the server's handlers and the binder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rocshare.api.allocation import AllocationRecord
from rocshare.api.models import AmdGpuPoolSpec, ShareLimits
from rocshare.core.fleet import FleetArrays
from rocshare.core.holdings import NO_HOST_REQUEST, Held, HostRequest
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare_operator.holds import Accounts, InFlight
from rocshare_operator.extender.index import ClusterIndex
from rocshare_operator.extender.plans import KeyMemo, NodeMemo
from rocshare_operator.extender.preemption import PodIndex
from rocshare_operator.extender.retry import Retrier
from rocshare_operator.extender.workloads import PoolWorkloads
from rocshare_operator.feed.cluster_facts import GpuNodeFacts, NodeFacts, PodFacts, QuotaFacts, pod_facts

__all__ = ["InFlight", "KeyMemo", "NodeMemo", "SchedulerState", "Snapshot"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a decision reads: the index, the ledger, blocked nodes and quota, as of now."""

    inventories: Mapping[str, NodeInventory]
    node_pools: Mapping[str, str]
    pools: Mapping[str, AmdGpuPoolSpec]
    ledger: Ledger
    blocked: frozenset[str]
    unreadable: Mapping[str, str]
    """Node -> why it offers nothing: its Node, AmdGpuNode or pool settings cannot be read."""
    plans: NodeMemo
    workloads: PoolWorkloads
    """Each pool's fragmentation model (workloads.py), for the scorers that read one."""
    fleet: FleetArrays
    """The nodes' loads as arrays, for the bulk planner (rocshare.core.fleet); kept in step by itself."""
    _index: ClusterIndex
    _accounts: Accounts
    pods: PodIndex = field(default_factory=PodIndex)
    """Priorities, pods being deleted and nominations (preemption.py)."""

    def pool_of(self, node_name: str) -> AmdGpuPoolSpec | None:
        return self._index.pool_of(node_name)

    def some_node_of_no_known_pool(self) -> bool:
        return self._index.some_node_of_no_known_pool()

    def quota_limits(self, namespace: str) -> ShareLimits:
        return self._index.quota_limits(namespace)

    def quota_used(self, namespace: str) -> Held:
        return self._accounts.used(namespace)

    def unaccountable_in(self, namespace: str) -> list[str]:
        return self._accounts.unaccountable_in(namespace) if self._accounts.unaccountable else []


@dataclass
class SchedulerState:
    index: ClusterIndex = field(default_factory=ClusterIndex)
    plans: NodeMemo = field(default_factory=NodeMemo)
    fleet: FleetArrays = field(default_factory=FleetArrays)
    accounts: Accounts = field(init=False)
    workloads: PoolWorkloads = field(init=False)
    retrier: Retrier | None = None
    pods: PodIndex = field(default_factory=PodIndex)
    scheduler_name: str = "rocshare-scheduler"
    resize_asked: dict[PodKey, PodFacts] = field(default_factory=dict)
    """Live pods carrying a resize request (rocshare.api.resize), as last seen: the resizer looks at
    them again when this replica starts deciding (resizer.py)."""
    on_resize: list = field(default_factory=list)
    """Called with the PodFacts of every event of a pod carrying a resize request (the resizer)."""
    changes: int = 0
    """Counts every event and commit taken: a decision made at one count still stands at the same
    count (nothing it read has changed), so bind need not plan twice when it did not wait."""

    def __post_init__(self) -> None:
        self.accounts = Accounts(self.index.cu_counts)
        self.workloads = PoolWorkloads(self.index.node_pools, self.index.cu_counts, self.scheduler_name)
        self.index.on_inventory.append(self._inventory_changed)
        self.index.on_quota_change.append(self._quota_changed)
        self.accounts.on_release.append(self._room_freed)

    def snapshot(self) -> Snapshot:
        index = self.index
        return Snapshot(index.inventories, index.node_pools, index.pools, self.accounts.ledger,
                        frozenset(self.accounts.blocked_nodes()), index.unreadable, self.plans, self.workloads,
                        self.fleet, index, self.accounts, self.pods)

    def dra_snapshot(self) -> Snapshot:
        """`snapshot()` over the nodes of pools serving DRA (what the score for DRA pods reads):
        their GPUs and the same hold index, claims included."""
        return replace(self.snapshot(), inventories=self.index.dra_inventories())

    # ---- events ------------------------------------------------------------------------------

    def on_node(self, kind: str, node: dict[str, Any]) -> None:
        self.changes += 1
        self.index.on_node(kind, node)

    def on_node_facts(self, kind: str, node: NodeFacts, before: NodeFacts | None = None) -> None:
        self.changes += 1
        self.index.on_node_facts(kind, node, before)

    def on_gpu_node(self, kind: str, obj: dict[str, Any]) -> None:
        self.changes += 1
        self.index.on_gpu_node(kind, obj)

    def on_gpu_node_facts(self, kind: str, facts: GpuNodeFacts, before: GpuNodeFacts | None = None) -> None:
        self.changes += 1
        self.index.on_gpu_node_facts(kind, facts, before)

    def on_pool(self, kind: str, obj: dict[str, Any]) -> None:
        self.changes += 1
        self.index.on_pool(kind, obj)

    def on_quota(self, kind: str, quota: dict[str, Any]) -> None:
        self.changes += 1
        self.index.on_quota(kind, quota)

    def on_quota_facts(self, kind: str, quota: QuotaFacts, before: QuotaFacts | None = None) -> None:
        self.changes += 1
        self.index.on_quota_facts(kind, quota, before)

    async def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """A Pod object (tests, benches); the operator feeds `on_pod_facts` from its one pod watch."""
        await self.on_pod_facts(kind, pod_facts(pod))

    async def on_pod_facts(self, kind: str, pod: PodFacts, _before: PodFacts | None = None) -> None:
        """The ledger first, inside the fail-closed guard; then the readers that cannot make GPUs
        look free (the waiting list, the fragmentation model). Each step runs even when an earlier
        one failed, and the first failure is raised afterwards, so the feed retries the event
        (every step is idempotent)."""
        self.changes += 1
        failures = [error for error in (self._account(kind, pod), self._guarded(self.pods.on_pod, kind, pod),
                                        self._guarded(self._track_waiting, kind, pod),
                                        self._guarded(self.workloads.on_pod, kind, pod),
                                        self._guarded(self._track_resize, kind, pod)) if error is not None]
        if failures:
            raise failures[0]

    def _account(self, kind: str, pod: PodFacts) -> Exception | None:
        try:
            self.accounts.on_pod(kind, pod)
        except Exception as error:
            # Fail closed: whatever the pod holds stays blocked until a retry of this event succeeds.
            if kind != "DELETED":
                self.accounts.hold_unknown(pod.key, pod.namespace, pod.node, f"reading it failed: {error!r}")
            return error
        return None

    @staticmethod
    def _guarded(step, kind: str, pod: PodFacts) -> Exception | None:
        try:
            step(kind, pod)
        except Exception as error:  # noqa: BLE001 -- handed back, raised once every step had its turn
            return error
        return None

    def _track_waiting(self, kind: str, pod: PodFacts) -> None:
        """Pods of our scheduler that kube-scheduler found unschedulable -- by its own filters too
        (e.g. Insufficient amd.com/gpu while a node's GPUs were down) -- are retried when room appears."""
        if self.retrier is None:
            return
        if kind == "DELETED" or pod.finished or pod.node or pod.scheduler_name != self.scheduler_name:
            self.retrier.forget(pod.key)
            return
        if pod.unschedulable is not None:
            self.retrier.note_waiting(pod.key, pod.namespace)

    def _track_resize(self, kind: str, pod: PodFacts) -> None:
        """After the ledger took the event: a pod asking a resize is handed to the resizer."""
        if kind == "DELETED" or pod.finished or pod.resize is None:
            self.resize_asked.pop(pod.key, None)
            return
        self.resize_asked[pod.key] = pod
        for callback in self.on_resize:
            callback(pod)

    def _inventory_changed(self, name: str, offers: bool) -> None:
        self.plans.forget(name)
        if offers and self.retrier is not None:
            self.retrier.room_freed()  # kube-scheduler may have retried on the node event before we saw it

    def _quota_changed(self, namespace: str) -> None:
        if self.retrier is not None:
            self.retrier.quota_changed(namespace)

    def _room_freed(self) -> None:
        if self.retrier is not None:
            self.retrier.room_freed()

    # ---- bind's accounting and in-flight gate (the binder's side effects) ------------------------

    def commit(self, key: PodKey, namespace: str, record: AllocationRecord, host: HostRequest = NO_HOST_REQUEST) -> None:
        self.changes += 1
        self.accounts.commit(key, namespace, record, host)

    def commit_host(self, key: PodKey, node: str, host: HostRequest) -> None:
        self.changes += 1
        self.accounts.commit_host(key, node, host)

    def replace(self, key: PodKey, namespace: str, record: AllocationRecord, *, interim: bool = False) -> None:
        """A resize's record in place of the pod's current one (Accounts.replace)."""
        self.changes += 1
        self.accounts.replace(key, namespace, record, interim=interim)

    async def uncommit(self, key: PodKey) -> None:
        self.changes += 1
        self.accounts.uncommit(key)

    async def wait_in_flight(self, node: str, key: PodKey, deadline: float) -> InFlight | None:
        """Until no pod but `key` is in flight on the node (DESIGN.md section 2 rule 2); the holder
        when the deadline (time.monotonic) passed first."""
        return await self.accounts.gate.wait_free(node, key, deadline)

    def hold_in_flight(self, node: str, key: PodKey) -> None:
        """`key` is in flight on the node from now until its kubelet admits it or it goes."""
        self.accounts.gate.acquire(node, key)

    # ---- read-only views (metrics, the binder, benches) ---------------------------------------

    @property
    def ledger(self) -> Ledger:
        return self.accounts.ledger

    @property
    def inventories(self) -> dict[str, NodeInventory]:
        return self.index.inventories

    @property
    def gpu_status(self) -> dict[str, GpuNodeFacts]:
        return self.index.gpu_status

    @property
    def pools(self) -> dict[str, AmdGpuPoolSpec]:
        return self.index.pools

    @property
    def quotas(self) -> dict[str, dict[str, ShareLimits]]:
        return self.index.quotas

    @property
    def namespace_costs(self) -> dict[str, Held]:
        return self.accounts.namespace_held

    def quota_limits(self, namespace: str) -> ShareLimits:
        return self.index.quota_limits(namespace)

