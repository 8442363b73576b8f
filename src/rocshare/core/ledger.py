"""The ledger: what every GPU holds, built only from committed AllocationRecords.

``apply(record, pod_key)`` adds a pod's slices, ``release(pod_key)`` removes them; the
ledger is therefore rebuildable from the records on the pods (DESIGN.md section 2, rule 5)
and releasing every pod returns it to empty. Per GPU it keeps the memory held (MiB), the
number of slices, the CU bitmask held, and how many whole-GPU slices sit there.

What a pod reserves of each GPU is rocshare.core.holdings' rule (`record_holding`), the one
every reader applies: whole GPUs and all-cores slices every CU, CU slices their ranges, Shared
slices without gpucores no CU; app and sidecar slices summed, a plain init container's over the
pod's slots (max(init, app), as Kubernetes counts it).

Usage is recomputed per GPU from its holders on every change, so a pair of conflicting
records (which the allocator never produces) cannot make subtraction go wrong.

Every change bumps the node's version and appends the node to a bounded journal, so a reader
holding answers for thousands of nodes learns which went stale since it last looked
(`changed_since`) without checking each node's version; `on_change` callbacks hear of every
change as it is journalled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord
from rocshare.core.cumask import full_mask
from rocshare.core.headroom import free_shares
from rocshare.core.holdings import GpuHold, record_holding
from rocshare.core.ids import GpuId, NodeName, PodKey
from rocshare.core.inventory import NodeInventory


@dataclass(frozen=True, slots=True)
class GpuUsage:
    memory_mib: int = 0
    slices: int = 0
    cu_mask: int = 0
    whole: int = 0
    """Whole-GPU slices held (0 or 1 unless records conflict)."""

    @property
    def cu_held(self) -> int:
        return self.cu_mask.bit_count()

    @property
    def load(self) -> tuple[int, int, int, int]:
        """(memory_mib, slices, cu_held, whole): the plain-int form the hot loop works on."""
        return (self.memory_mib, self.slices, self.cu_mask.bit_count(), self.whole)


EMPTY_GPU = GpuUsage()


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """A node's usage, GPUs in the inventory's order. ``key`` is hashable for memoising."""

    gpus: tuple[GpuUsage, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    loads: tuple[tuple[int, int, int, int], ...] = ()
    free_milli: tuple[int, ...] = ()
    """Each GPU's free share (rocshare.core.headroom) under ``loads``; empty when the usage was made
    without the node's specs. `Ledger.usage` fills it, once per change of the node."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "loads", tuple(g.load for g in self.gpus))

    @property
    def key(self) -> tuple:
        return self.loads

    @property
    def empty(self) -> bool:
        return all(g == EMPTY_GPU for g in self.gpus) and not self.cpu_milli and not self.memory_mib


def empty_usage(node: NodeInventory) -> NodeUsage:
    return usage_of(node, (EMPTY_GPU,) * len(node.gpus))


def usage_of(node: NodeInventory, gpus: tuple[GpuUsage, ...], cpu_milli: int = 0, memory_mib: int = 0) -> NodeUsage:
    """The node's usage with each GPU's free share filled in (set once, as __post_init__ sets loads)."""
    usage = NodeUsage(gpus, cpu_milli, memory_mib)
    object.__setattr__(usage, "free_milli", free_shares(node, usage.loads))
    return usage


def hold_usage(hold: GpuHold) -> GpuUsage:
    """What one pod's hold on a GPU takes of it."""
    return GpuUsage(hold.memory_mib, hold.slices, hold.cu_mask, hold.whole)


def add_usage(a: GpuUsage, b: GpuUsage) -> GpuUsage:
    return GpuUsage(a.memory_mib + b.memory_mib, a.slices + b.slices, a.cu_mask | b.cu_mask, a.whole + b.whole)


GpuKey = tuple[NodeName, GpuId]
JOURNAL_MAX = 100_000
"""Changes the journal keeps; past it the older half is dropped (a reader that far behind resyncs)."""


class Ledger:
    """Mutable index of records; an object the caller owns (no module state)."""

    def __init__(self) -> None:
        self._records: dict[PodKey, AllocationRecord] = {}
        self._host: dict[PodKey, tuple[int, int]] = {}
        self._host_only: dict[PodKey, tuple[NodeName, int, int]] = {}
        # GPUs are keyed by (node, GPU id): ids derived from PCI addresses (APUs, partitions)
        # repeat across nodes, and so do unique ids on simulated fleets.
        self._holders: dict[GpuKey, dict[PodKey, GpuUsage]] = {}
        self._gpu: dict[GpuKey, GpuUsage] = {}
        self._node_host: dict[NodeName, tuple[int, int]] = {}
        self._versions: dict[NodeName, int] = {}
        self._journal: list[NodeName] = []
        self._journal_start = 0
        """The position of `_journal[0]`: older entries were dropped (JOURNAL_MAX)."""
        self.on_change: list[Callable[[], None]] = []
        """Called after every change (an apply, a release, a host hold), once the journal has it."""
        self._usage_cache: dict[NodeName, tuple[int, NodeInventory, NodeUsage]] = {}

    @classmethod
    def from_records(cls, records: Iterable[tuple[PodKey, AllocationRecord]]) -> Ledger:
        ledger = cls()
        for key, record in records:
            ledger.apply(record, key)
        return ledger

    def apply(self, record: AllocationRecord, pod_key: PodKey, *, cpu_milli: int = 0, memory_mib: int = 0) -> None:
        """Add a pod's record; applying the same pod twice replaces its earlier record."""
        if pod_key in self._records or pod_key in self._host_only:
            self.release(pod_key)
        self._records[pod_key] = record
        self._host[pod_key] = (cpu_milli, memory_mib)
        node = NodeName(record.node)
        self._add_host(node, cpu_milli, memory_mib)
        touched: set[GpuKey] = set()
        for hold in record_holding(record).gpus:
            gpu = (node, GpuId(hold.gpu_id))
            self._holders.setdefault(gpu, {})[pod_key] = hold_usage(hold)
            touched.add(gpu)
        self._recompute(touched)
        self._bump(node)

    def add_host(self, node: str, pod_key: PodKey, *, cpu_milli: int, memory_mib: int) -> None:
        """Count a GPU-less pod's host CPU and memory (only where the node model tracks them)."""
        if pod_key in self._records or pod_key in self._host_only:
            self.release(pod_key)
        self._host_only[pod_key] = (NodeName(node), cpu_milli, memory_mib)
        self._add_host(NodeName(node), cpu_milli, memory_mib)
        self._bump(NodeName(node))

    def _add_host(self, node: NodeName, cpu_milli: int, memory_mib: int) -> None:
        cpu, mem = self._node_host.get(node, (0, 0))
        total = (cpu + cpu_milli, mem + memory_mib)
        if total == (0, 0):
            self._node_host.pop(node, None)
        else:
            self._node_host[node] = total

    def release(self, pod_key: PodKey) -> AllocationRecord | None:
        """Remove a pod; returns its record (None for an unknown or GPU-less pod)."""
        host_only = self._host_only.pop(pod_key, None)
        if host_only is not None:
            node, cpu_milli, memory_mib = host_only
            self._add_host(node, -cpu_milli, -memory_mib)
            self._bump(node)
            return None
        record = self._records.pop(pod_key, None)
        if record is None:
            return None
        cpu_milli, memory_mib = self._host.pop(pod_key)
        node = NodeName(record.node)
        self._add_host(node, -cpu_milli, -memory_mib)
        touched = {(node, GpuId(gpu)) for gpu in record.gpu_ids()}
        for gpu in touched:
            self._holders[gpu].pop(pod_key, None)
        self._recompute(touched)
        self._bump(node)
        return record

    def _recompute(self, gpus: Iterable[GpuKey]) -> None:
        for gpu in gpus:
            holders = self._holders.get(gpu)
            if not holders:
                self._holders.pop(gpu, None)
                self._gpu.pop(gpu, None)
                continue
            total = EMPTY_GPU
            for usage in holders.values():
                total = add_usage(total, usage)
            self._gpu[gpu] = total

    def _bump(self, node: NodeName) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1
        self._journal.append(node)
        if len(self._journal) > JOURNAL_MAX:
            dropped = len(self._journal) // 2
            del self._journal[:dropped]
            self._journal_start += dropped
        for callback in self.on_change:
            callback()

    # ---- views --------------------------------------------------------------------------

    def gpu_usage(self, node: str, gpu_id: str) -> GpuUsage:
        return self._gpu.get((NodeName(node), GpuId(gpu_id)), EMPTY_GPU)

    def node_version(self, node: str) -> int:
        """Changes whenever a record on that node is applied or released."""
        return self._versions.get(NodeName(node), 0)

    @property
    def journal_end(self) -> int:
        """The position after the last change: what a reader passes to `changed_since` next time."""
        return self._journal_start + len(self._journal)

    def changed_since(self, position: int) -> list[NodeName] | None:
        """The nodes changed since `position` (a past `journal_end`; repeats possible), or None when
        that part of the journal was dropped: then the reader must take every node as changed."""
        if position < self._journal_start:
            return None
        return self._journal[position - self._journal_start:]

    @property
    def versions(self) -> Mapping[str, int]:
        """Every node's `node_version` (absent = 0), for callers that check thousands of nodes."""
        return self._versions

    def usage(self, node: NodeInventory) -> NodeUsage:
        """The node's usage in its GPU order (cached until the node's records change)."""
        version = self.node_version(node.name)
        cached = self._usage_cache.get(node.name)
        if cached is not None and cached[0] == version and cached[1] is node:
            return cached[2]
        cpu, mem = self._node_host.get(node.name, (0, 0))
        usage = usage_of(node, tuple(clipped(self._gpu.get((node.name, g.gpu_id), EMPTY_GPU), g.cu_count)
                                     for g in node.gpus), cpu, mem)
        self._usage_cache[node.name] = (version, node, usage)
        return usage

    def holders(self, node: NodeInventory) -> dict[PodKey, list[tuple[int, GpuUsage]]]:
        """Every pod holding something of the node's GPUs: its (GPU position, hold) per GPU; pods
        holding only host resources there are `host_holders`."""
        found: dict[PodKey, list[tuple[int, GpuUsage]]] = {}
        holders, name = self._holders, node.name
        for pos, spec in enumerate(node.gpus):
            on_gpu = holders.get((name, spec.gpu_id))
            if on_gpu:
                for key, usage in on_gpu.items():
                    if key in found:
                        found[key].append((pos, usage))
                    else:
                        found[key] = [(pos, usage)]
        return found

    def host_of(self, pod_key: PodKey) -> tuple[int, int]:
        """(CPU millicores, memory MiB) the pod holds of its node (0, 0 when none)."""
        host = self._host.get(pod_key)
        if host is not None:
            return host
        only = self._host_only.get(pod_key)
        return (only[1], only[2]) if only is not None else (0, 0)

    def records(self) -> dict[PodKey, AllocationRecord]:
        return dict(self._records)

    def record(self, pod_key: PodKey) -> AllocationRecord | None:
        """The record applied for the pod, if any (the very object given to `apply`)."""
        return self._records.get(pod_key)

    def __contains__(self, pod_key: object) -> bool:
        return pod_key in self._records or pod_key in self._host_only

    def __len__(self) -> int:
        return len(self._records) + len(self._host_only)

    @property
    def is_empty(self) -> bool:
        return not self._records and not self._host_only and not self._gpu and not self._node_host


def clipped(usage: GpuUsage, cu_count: int) -> GpuUsage:
    """Usage with its CU mask cut to the GPU's CUs: a hold whose CUs are unknown (a pod HAMi placed,
    not yet served by HAMi's plugin) reserves every CU a GPU could have (holdings.UNKNOWN_CUS_RANGE)."""
    if usage.cu_mask >> cu_count == 0:
        return usage
    return GpuUsage(usage.memory_mib, usage.slices, usage.cu_mask & full_mask(cu_count), usage.whole)
