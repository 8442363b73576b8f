"""The cluster index: what the extender knows of nodes, their GPUs, pools and quotas, fed by
events (never the source of truth).

Fed by the operator's cluster feed (Nodes, AmdGpuNodes and ResourceQuotas as `NodeFacts`,
`GpuNodeFacts` and `QuotaFacts`) and by an informer on AmdGpuPools. It keeps only what
decisions read:
* per node its facts (never the body) and its pool label;
* per AmdGpuNode slotted `GpuFacts` (never the pydantic status);
* per node a `NodeInventory` from the agent's AmdGpuNode status, the pool settings the
  operator wrote on the Node (a node whose Node, AmdGpuNode or settings cannot be read offers
  nothing and is listed in `unreadable` with why: fail closed, never the defaults) and the
  Node's allocatable CPU and memory (scored and fitted against every live pod's requests, as the simulator does; 0 = not listed, left to kube-scheduler) (a node
  whose allocatable amd.com/gpu is 0, whose quantity cannot be read, that has no status, or whose
  agent says its device plugin is not watched by the kubelet (DevicePlugin False: the agent is
  starting or stopping, the kubelet restarted) offers nothing);
* per namespace the amd.com limits of its ResourceQuotas (a limit that cannot be read is
  taken as 0: fail closed, the namespace gets nothing more until it is fixed).
`on_inventory` callbacks hear of every node whose inventory changed or went (the plan cache
forgets it, the retrier wakes waiting pods).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rocshare.api.models import AgentInterface, AmdGpuPoolSpec, ShareLimits
from rocshare.core.inventory import NodeInventory, node_inventory
from rocshare.core.quantity import QuantityError, whole_quantity
from rocshare_operator.feed.cluster_facts import (GpuNodeFacts, NodeFacts, QuotaFacts, gpu_node_facts, node_facts,
                                                  quota_facts)

log = logging.getLogger(__name__)

QUOTA_MEMORY = "limits.amd.com/gpumem"
QUOTA_CORES = "limits.amd.com/gpucores"
QUOTA_GPUS = "requests.amd.com/gpu"
QUOTA_UNITS = {QUOTA_MEMORY: "MiB", QUOTA_CORES: "percent of one GPU", QUOTA_GPUS: "GPUs"}


@dataclass
class ClusterIndex:
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    gpu_status: dict[str, GpuNodeFacts] = field(default_factory=dict)
    """Node name -> its AmdGpuNode's GPUs (only nodes whose status was accepted)."""
    pools: dict[str, AmdGpuPoolSpec] = field(default_factory=dict)
    inventories: dict[str, NodeInventory] = field(default_factory=dict)
    node_pools: dict[str, str] = field(default_factory=dict)
    """Node name -> its pool label (an index of nodes, read once per node per decision)."""
    quotas: dict[str, dict[str, ShareLimits]] = field(default_factory=dict)
    status_problems: dict[str, str] = field(default_factory=dict)
    """Node name -> why its AmdGpuNode's status was refused (invalid, or a GPU listed twice)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Node name -> why it offers nothing: its Node, its AmdGpuNode or its pool settings cannot be
    read (filter's NodeUnreadable reason). Never a guess at what it holds."""
    dra_nodes: dict[str, NodeInventory] = field(default_factory=dict)
    """Node name -> its GPUs, for nodes of pools serving DRA (kube-scheduler's DRA allocator places
    on them; the extender only scores them, `dra_inventories`). Never in `inventories`."""
    on_inventory: list[Callable[[str, bool], None]] = field(default_factory=list)
    """Called with (node name, whether it now offers GPUs) when a node's inventory changed or went."""
    on_quota_change: list[Callable[[str], None]] = field(default_factory=list)
    _unpooled: bool | None = field(default=None, repr=False)
    """`some_node_of_no_known_pool`'s answer, None once something it reads changed."""

    # ---- nodes and inventory ------------------------------------------------------------

    def on_node(self, kind: str, node: dict[str, Any]) -> None:
        """A Node object (tests, benches); the operator feeds `on_node_facts` from its one node watch."""
        self.on_node_facts(kind, node_facts(node))

    def on_node_facts(self, kind: str, node: NodeFacts, _before: NodeFacts | None = None) -> None:
        name = node.name
        pool_before = self.node_pools.get(name)
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
        if self.node_pools.get(name) != pool_before:
            self._membership_changed()
        self._rebuild_inventory(name)

    def on_gpu_node(self, kind: str, obj: dict[str, Any]) -> None:
        """An AmdGpuNode object (tests, benches); the operator feeds `on_gpu_node_facts` from its one watch."""
        self.on_gpu_node_facts(kind, gpu_node_facts(obj))

    def on_gpu_node_facts(self, kind: str, facts: GpuNodeFacts, _before: GpuNodeFacts | None = None) -> None:
        name = facts.name
        if kind == "DELETED" or facts.gpus is None:
            problem = facts.problem if kind != "DELETED" else None
            if problem and self.status_problems.get(name) != problem:
                log.error("AmdGpuNode %s: %s; it offers nothing until it can be read", name, problem)
            self._set(self.status_problems, name, problem)
            self.gpu_status.pop(name, None)
        else:
            self._accept_status(name, facts)
        self._rebuild_inventory(name)

    @staticmethod
    def _set(problems: dict[str, str], name: str, problem: str | None) -> None:
        if problem is None:
            problems.pop(name, None)
        else:
            problems[name] = problem

    def _accept_status(self, name: str, status: GpuNodeFacts) -> None:
        """A GPU listed twice would be offered twice (double its memory and CUs, or one pod handed
        the same device twice): the node offers nothing until its status is fixed."""
        seen: set[str] = set()
        repeated = sorted({gpu.id for gpu in status.gpus or () if gpu.id in seen or seen.add(gpu.id)})
        if not repeated:
            self.status_problems.pop(name, None)
            self.gpu_status[name] = status
            return
        problem = f"its AmdGpuNode lists GPU {', '.join(repeated)} more than once"
        if self.status_problems.get(name) != problem:
            log.error("node %s: %s; ignoring its GPUs until its agent publishes each once", name, problem)
        self.status_problems[name] = problem
        self.gpu_status.pop(name, None)

    def on_pool(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self._membership_changed()
        if kind == "DELETED":
            self.pools.pop(name, None)
        else:
            try:
                self.pools[name] = AmdGpuPoolSpec.model_validate(obj.get("spec", {}))
            except ValidationError as error:
                log.error("AmdGpuPool %s has an invalid spec: %s", name, error.errors()[0])
        for node in [*self.dra_nodes, *self.gpu_status]:  # a pool's interface decides which nodes serve DRA
            self._rebuild_dra(node)

    def dra_inventories(self) -> Mapping[str, NodeInventory]:
        """The GPUs of nodes in pools serving DRA (kube-scheduler's allocator places on them; the
        extender scores them for DRA pods and metrics report their claims against them)."""
        return self.dra_nodes

    def _rebuild_dra(self, name: str) -> None:
        """The node's DRA inventory (inventory.node_inventory, with the Node's allocatable CPU and memory:
        the hold index counts every bound pod's), while its pool serves DRA and the node can be read."""
        status, node = self.gpu_status.get(name), self.nodes.get(name)
        pool = self.pools.get(self.node_pools.get(name, ""))
        inventory = None
        if (pool is not None and pool.agent.interface == AgentInterface.DRA and status is not None
                and node is not None and name not in self.unreadable):
            inventory = node_inventory(name, status.gpus, node.view.marks.sharing(),
                                       cpu_milli=node.cpu_milli, memory_mib=node.memory_mib)
        if not isinstance(inventory, NodeInventory):
            self.dra_nodes.pop(name, None)
        elif inventory != self.dra_nodes.get(name):
            self.dra_nodes[name] = inventory

    def _membership_changed(self) -> None:
        self._unpooled = None

    def some_node_of_no_known_pool(self) -> bool:
        """Whether a node with an inventory has no pool label, or one naming no AmdGpuPool the
        index knows (those nodes take the default policy). Worked out again only after a node's
        inventory or pool label, or a pool, changed: decisions ask it on every call."""
        if self._unpooled is None:
            self._unpooled = bool(self.inventories.keys() - self.node_pools.keys()
                                  or not set(self.node_pools.values()) <= self.pools.keys())
        return self._unpooled

    def pool_of(self, node_name: str) -> AmdGpuPoolSpec | None:
        pool = self.node_pools.get(node_name)
        return self.pools.get(pool) if pool else None

    def cu_counts(self, node_name: str) -> dict[str, int]:
        """The node's GPU id -> CU count (what old records' cores are read against)."""
        node = self.inventories.get(node_name) or self.dra_nodes.get(node_name)
        return {gpu.gpu_id: gpu.cu_count for gpu in node.gpus} if node else {}

    def _rebuild_inventory(self, name: str) -> None:
        node = self.nodes.get(name)
        status = self.gpu_status.get(name)
        inventory = None if node is None else node_inventory(
            name, status.gpus or () if status is not None else (), node.view.marks.sharing(),  # GpuFacts: GpuInfo's
            cpu_milli=node.cpu_milli, memory_mib=node.memory_mib)
        self._set(self.unreadable, name, self._problem(name, node, inventory if isinstance(inventory, str) else None))
        self._rebuild_dra(name)
        if (not isinstance(inventory, NodeInventory) or status is None or not status.plugin_serving
                or not _allocatable_gpus(node)):
            if self.inventories.pop(name, None) is not None:
                self._inventory_changed(name, False)
            return
        if inventory != self.inventories.get(name):
            self.inventories[name] = inventory
            self._inventory_changed(name, True)

    def _inventory_changed(self, name: str, offers: bool) -> None:
        self._membership_changed()
        for callback in self.on_inventory:
            callback(name, offers)

    def _problem(self, name: str, node: NodeFacts | None, unreadable: str | None) -> str | None:
        """Why the node cannot be read (`unreadable`: why its GPUs cannot, inventory.node_inventory),
        logged once per new problem; None when it can."""
        problem = (node.problem if node is not None else None) or self.status_problems.get(name) or unreadable
        if problem and problem != self.unreadable.get(name) and problem != self.status_problems.get(name):
            log.error("node %s: %s; it offers nothing until it can be read", name, problem)
        return problem

    # ---- quotas ----------------------------------------------------------------------------

    def on_quota(self, kind: str, quota: dict[str, Any]) -> None:
        """A ResourceQuota object (tests, benches); the operator feeds `on_quota_facts` from its one watch."""
        self.on_quota_facts(kind, quota_facts(quota))

    def on_quota_facts(self, kind: str, quota: QuotaFacts, _before: QuotaFacts | None = None) -> None:
        namespace, name = quota.namespace, quota.name
        per_namespace = self.quotas.setdefault(namespace, {})
        for callback in self.on_quota_change:
            callback(namespace)
        if kind == "DELETED":
            per_namespace.pop(name, None)
            return
        hard = quota.hard
        per_namespace[name] = ShareLimits(
            memory_mib=_quota_value(hard, QUOTA_MEMORY, namespace, name),
            cores_pct=_quota_value(hard, QUOTA_CORES, namespace, name),
            gpus=_quota_value(hard, QUOTA_GPUS, namespace, name),
        )

    def quota_limits(self, namespace: str) -> ShareLimits:
        limits = list(self.quotas.get(namespace, {}).values())
        return ShareLimits(
            memory_mib=_tightest(limit.memory_mib for limit in limits),
            cores_pct=_tightest(limit.cores_pct for limit in limits),
            gpus=_tightest(limit.gpus for limit in limits),
        )


def _quota_value(hard: dict[str, Any], key: str, namespace: str, name: str) -> int | None:
    """The limit, as the API server writes it (40000 arrives as "40k"). One that cannot be read
    counts 0: the namespace takes nothing more of it until the quota is fixed (fail closed)."""
    if key not in hard:
        return None
    try:
        return whole_quantity(hard[key], name=key, unit=QUOTA_UNITS[key])
    except QuantityError as error:
        log.error("ResourceQuota %s/%s: %s; counting it as 0 until it is fixed", namespace, name, error)
        return 0


def _tightest(values) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _allocatable_gpus(node: NodeFacts) -> int:
    """The node's allocatable amd.com/gpu (or its partition names); one that cannot be read offers
    nothing, and so does one not listed yet. Until the agent's device plugin has registered, the
    kubelet knows no such resource: it drops it from the pod's requests at admission and starts the
    containers without calling the plugin's Allocate, so a pod bound there would run with no GPU while
    its record holds one. The node is offered once the kubelet lists the devices."""
    if node.gpus_allocatable is None:
        return 0
    try:
        return whole_quantity(node.gpus_allocatable, name="amd.com/gpu", unit="GPUs")
    except QuantityError as error:
        log.error("node %s: allocatable %s; it takes no new pods", node.name, error)
        return 0
