"""The node model the allocator works on, built from the inventory the node agent publishes.

A ``GpuSpec`` is one schedulable device (a GPU, or a compute partition in partition mode)
with the numbers the allocator needs as plain ints: registered memory (VRAM times
deviceMemoryScaling), CU count, CUs per WGP, NUMA node, XGMI peers (as GPU ids on the same
node), split count, health. Everything is frozen; a new inventory replaces the old one.

``NodeInventory.shape`` is a hashable key of everything fit and scoring read except GPU
identity (ids, uuids): two nodes with the same shape and the same usage give the same
answer to a request that filters by no uuid, which lets callers memoise per shape.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar
from weakref import WeakValueDictionary

from rocshare.api.gfx import effective_memory_scaling, is_rdna
from rocshare.api.models import CuLayout, GpuInfo, OmittedCores, OperatingMode, Sharing
from rocshare.api.resource_names import GPU_RESOURCE, partition_resource
from rocshare.core.cu_topology import CuTopology
from rocshare.core.ids import GpuId, NodeName


class ShapeKey:
    """A hashable node shape whose hash is computed once (dict lookups in hot loops).

    ``ShapeKey.of`` interns: every live key of one shape is the same object, so a lookup
    compares by identity instead of walking the nested tuple (a microsecond per lookup at
    8 GPUs, paid per node by every memo keyed on shape). The table holds keys weakly; it
    changes no answer, only how fast equal keys are found equal.
    """

    __slots__ = ("key", "_hash", "__weakref__")
    _interned: ClassVar[WeakValueDictionary[tuple, ShapeKey]] = WeakValueDictionary()

    def __init__(self, key: tuple) -> None:
        self.key = key
        self._hash = hash(key)

    @classmethod
    def of(cls, key: tuple) -> ShapeKey:
        found = cls._interned.get(key)
        if found is None:
            found = cls(key)
            cls._interned[key] = found
        return found

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, ShapeKey) and self._hash == other._hash and self.key == other.key)

    def __repr__(self) -> str:
        return f"ShapeKey({self._hash:#x})"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    gpu_id: GpuId
    index: int
    memory_mib: int
    cu_count: int
    product: str = ""
    gfx_target_version: int = 90010
    cu_per_wgp: int = 1
    numa: int | None = None
    xgmi_peers: tuple[GpuId, ...] = ()
    """The GPU ids of its XGMI peers, sorted (a tuple: a frozenset per GPU costs four to six times
    the memory, 12 MiB at 5,000 MI300X-like nodes; only NodeInventory's links read it)."""
    split_count: int = 10
    healthy: bool = True
    partition: bool = False
    resource: str = GPU_RESOURCE
    """The extended resource it is offered under (rocshare.api.resource_names)."""
    partition_kind: str = ""
    """A partition's kind as mixed naming names it (rocshare.api.resource_names.partition_resource:
    amd.com/cpx_nps4), whatever the pool's naming; "" for a GPU that is no partition of a known mode."""
    topology: CuTopology | None = None
    """Where the kernel puts each CU mask bit (rocshare.core.cu_topology); None when the agent did not say."""
    cu_layout: CuLayout = CuLayout.PACKED
    """How its slices' CUs are chosen (rocshare.core.cu_layout); Isolated needs the topology."""
    # Derived once (the fit loop reads them for every GPU of every node it plans):
    product_lower: str = field(default="", compare=False)
    cu_align: int = field(init=False, compare=False, repr=False)
    """CU ranges start and end on this boundary: whole WGPs on RDNA, single CUs else."""
    cu_usable: int = field(init=False, compare=False, repr=False)
    """CUs that whole aligned units cover (all of them unless an RDNA part has an odd count)."""
    max_slices: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        align = self.cu_per_wgp if is_rdna(self.gfx_target_version) else 1
        object.__setattr__(self, "product_lower", sys.intern(self.product.lower()))  # one per product, not per GPU
        object.__setattr__(self, "cu_align", align)
        object.__setattr__(self, "cu_usable", self.cu_count - self.cu_count % align)
        object.__setattr__(self, "max_slices", 1 if self.partition else self.split_count)


@dataclass(frozen=True, slots=True)
class NodeInventory:
    name: NodeName
    gpus: tuple[GpuSpec, ...]
    omitted_cores: OmittedCores = OmittedCores.EXCLUSIVE
    oversubscribed: bool = False
    cpu_milli: int = 0
    """Host CPU; 0 = not tracked here (kube-scheduler checks it)."""
    memory_mib: int = 0
    """Host memory; 0 = not tracked here."""
    shape: ShapeKey = field(default=ShapeKey(()), compare=False)
    links: tuple[frozenset[int], ...] = field(default=(), compare=False)
    """Per GPU position, the positions of its XGMI peers on this node."""
    twins: tuple[int, ...] = field(default=(), compare=False)
    """Per GPU position, the first position whose GPU is alike in every number fit and scoring
    read of one GPU (its shape but NUMA node and peers): under equal loads, twins fit and score alike."""

    def __post_init__(self) -> None:
        positions = {gpu.gpu_id: pos for pos, gpu in enumerate(self.gpus)}
        links = tuple(frozenset(positions[p] for p in gpu.xgmi_peers if p in positions) for gpu in self.gpus)
        gpu_shapes = tuple(
            (g.memory_mib, g.cu_count, g.product_lower, g.gfx_target_version, g.cu_per_wgp, g.numa,
             g.split_count, g.healthy, g.partition, g.resource, g.topology, g.cu_layout)
            for g in self.gpus
        )
        shape = ShapeKey.of((gpu_shapes, links, self.omitted_cores, self.cpu_milli, self.memory_mib))
        object.__setattr__(self, "shape", shape)
        # The links are part of the shape: nodes alike share one tuple of them (the first node's),
        # instead of a frozenset per GPU each (18 MiB at 5,000 8-GPU nodes with XGMI).
        object.__setattr__(self, "links", shape.key[1])
        first: dict[tuple, int] = {}
        object.__setattr__(self, "twins", tuple(first.setdefault(g[:5] + g[6:], pos) for pos, g in enumerate(gpu_shapes)))

    @classmethod
    def from_gpu_infos(
        cls,
        name: str,
        gpus: Iterable[GpuInfo],
        sharing: Sharing,
        *,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> NodeInventory:
        infos = sorted(gpus, key=lambda info: info.index)
        by_bdf = {info.pci_bdf: GpuId(info.id) for info in infos}
        partition_mode = sharing.operating_mode == OperatingMode.PARTITION
        specs = tuple(_spec(pos, info, by_bdf, sharing, partition_mode) for pos, info in enumerate(infos))
        return cls(
            name=NodeName(name),
            gpus=specs,
            omitted_cores=sharing.omitted_cores,
            oversubscribed=any(effective_memory_scaling(info.gfx_target_version, sharing.device_memory_scaling) > 1.0
                               for info in infos),
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
        )

    def position_of(self, gpu_id: str) -> int | None:
        for pos, gpu in enumerate(self.gpus):
            if gpu.gpu_id == gpu_id:
                return pos
        return None



def node_inventory(name: str, gpus: Iterable[GpuInfo] | None, sharing: Sharing | str, *, cpu_milli: int = 0,
                   memory_mib: int = 0) -> NodeInventory | str:
    """A node's GPUs as its agent publishes them, the one rule every operator reader follows (issue
    45): the GPUs its AmdGpuNode lists, read with the pool's sharing settings marked on the Node
    (the annotation the agent itself reads), never the AmdGpuPool's spec, which the marks follow
    only once the pool loop has run. Why not, when the GPUs are not listed (`gpus` None) or the
    settings cannot be read (`sharing` is then why): the agent offers nothing while they cannot."""
    if gpus is None:
        return "its AmdGpuNode lists no GPUs"
    if isinstance(sharing, str):
        return f"its pool settings cannot be read: {sharing}"
    return NodeInventory.from_gpu_infos(name, gpus, sharing, cpu_milli=cpu_milli, memory_mib=memory_mib)


def _spec(pos: int, info: GpuInfo, by_bdf: dict[str, GpuId], sharing: Sharing, partition_mode: bool) -> GpuSpec:
    # Registered memory: an unknown VRAM size registers 0 MiB, so only whole-GPU requests fit.
    # Scaling applies only where the GPU can oversubscribe (never RDNA: see rocshare.api.gfx).
    registered_mib = int((info.vram_mib or 0)
                         * effective_memory_scaling(info.gfx_target_version, sharing.device_memory_scaling))
    return GpuSpec(
        gpu_id=GpuId(info.id),
        index=pos,
        memory_mib=registered_mib,
        cu_count=info.cu_count,
        product=info.product,
        gfx_target_version=info.gfx_target_version,
        cu_per_wgp=info.cu_per_wgp,
        numa=info.numa,
        xgmi_peers=tuple(sorted({by_bdf[bdf] for bdf in info.xgmi_peers if bdf in by_bdf})),
        split_count=info.split_count,
        healthy=info.healthy,
        partition=partition_mode or info.partition is not None,
        resource=info.resource,  # as the agent names and registers it (rocshare.api.resource_names.named)
        partition_kind=sys.intern(partition_resource(info.partition) or ""),
        topology=gpu_topology(info),
        cu_layout=sharing.layout_for(info.gfx_target_version),
    )


def gpu_topology(info: GpuInfo) -> CuTopology | None:
    """Where the kernel puts the GPU's CU mask bits, from what its agent reported (None: not reported)."""
    found = info.cu_topology
    if found is None:
        return None
    return CuTopology.from_kfd(num_xcc=found.num_xcc, array_count=found.array_count,
                               simd_arrays_per_engine=found.simd_arrays_per_engine,
                               cu_per_simd_array=found.cu_per_simd_array, cu_count=info.cu_count,
                               gfx_target_version=info.gfx_target_version)
