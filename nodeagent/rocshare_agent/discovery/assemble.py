"""Pure assembly of the node's inventory from parsed KFD nodes and DRM devices.

No I/O: `assemble` takes what kfd.py and drm.py produced and returns `GpuInfo`s plus
problems. Invariants:

* KFD decides what exists (a GPU without a KFD node cannot run ROCm work); DRM only adds
  facts (VRAM, product, NUMA, partition modes). A GPU without a DRM folder still publishes.
* One entry per KFD GPU node, in KFD order; `index` counts them from 0.
* KFD nodes sharing domain:bus:device but differing in function are the compute
  partitions of one GPU. Two nodes with the very same PCI address are one GPU listed twice:
  the first wins, the second is a problem.
* ids are unique: GPU-<16 hex digits of unique_id>, with -p<k> for partition k (partitions
  share their GPU's unique_id); GPU-pci-<address> when unique_id is 0 (APUs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from rocshare.api.models import CuTopologyInfo, DiscoveryProblem, GpuInfo, OperatingMode, Partition
from rocshare.core.cu_topology import CuTopology
from rocshare_agent.discovery import pci
from rocshare_agent.discovery.names import AmdgpuIds, product_name
from rocshare_agent.discovery.drm import DrmDevice
from rocshare_agent.discovery.kfd import LINK_TYPE_PCIE, LINK_TYPE_XGMI, KfdCpu, KfdGpu, PciAddress

MIB = 1024 * 1024
DEFAULT_SPLIT_COUNT = 10
GFX12_SPLIT_COUNT = 2

_MEMORY_PARTITION_COUNTS = {"nps1": 1, "nps2": 2, "nps4": 4, "nps8": 8}
_PARTITION_MODES_BY_COUNT = {2: "dpx", 3: "tpx", 4: "qpx"}


@dataclass(frozen=True)
class Inventory:
    gpus: list[GpuInfo] = field(default_factory=list)
    problems: list[DiscoveryProblem] = field(default_factory=list)
    kfd_gpu_ids: dict[str, int] = field(default_factory=dict)  # GpuInfo.id -> KFD gpu_id (vram_<gpu_id> files)
    drm_paths: dict[str, str] = field(default_factory=dict)  # GpuInfo.id -> DRM device folder
    compute_queues: dict[str, int] = field(default_factory=dict)  # GpuInfo.id -> KFD num_cp_queues
    product_sources: dict[str, str] = field(default_factory=dict)  # GpuInfo.id -> where its product name came from


@dataclass(frozen=True)
class _Context:
    nodes: dict[int, KfdGpu]
    cpus: frozenset[int]
    drm_by_pci: dict[PciAddress, DrmDevice]
    xcp_cards: dict[int, int]
    operating_mode: OperatingMode
    split_count: int
    ids: AmdgpuIds


def split_count_for(gfx_target_version: int, *, operating_mode: OperatingMode, pool_split_count: int) -> int:
    """Partition mode: 1. An explicit pool splitCount wins. Else 10, or 2 on gfx12 (RDNA4)."""
    if operating_mode == OperatingMode.PARTITION:
        return 1
    if pool_split_count > 0:
        return pool_split_count
    return GFX12_SPLIT_COUNT if gfx_target_version in pci.GFX12_RANGE else DEFAULT_SPLIT_COUNT


def assemble(kfd_nodes: Sequence[KfdGpu | KfdCpu], drm_devices: Sequence[DrmDevice], *,
             xcp_cards: dict[int, int] | None = None, operating_mode: OperatingMode = OperatingMode.CU,
             split_count: int = 0, ids: AmdgpuIds | None = None) -> Inventory:
    """`ids`: libdrm's amdgpu.ids table (names.load_amdgpu_ids); without it names come from DRM
    and rocshare's built-in table only."""
    gpus, problems = _unique_by_pci([node for node in kfd_nodes if isinstance(node, KfdGpu)])
    context = _Context(
        nodes={gpu.node_id: gpu for gpu in gpus},
        cpus=frozenset(node.node_id for node in kfd_nodes if isinstance(node, KfdCpu)),
        drm_by_pci={device.pci: device for device in drm_devices if device.pci is not None},
        xcp_cards=xcp_cards or {},
        operating_mode=operating_mode,
        split_count=split_count,
        ids=ids or {},
    )
    groups = _partition_groups(gpus)
    problems += _missing_partition_problems(groups, context)
    infos, ids, sources = [], set(), {}
    for index, gpu in enumerate(gpus):
        info, source = _gpu_info(gpu, index, groups[gpu.pci.slot], context)
        if info.id in ids:  # a duplicated unique_id: the PCI address still tells them apart
            info = info.model_copy(update={"id": _pci_id(gpu.pci)})
        ids.add(info.id)
        infos.append(info)
        sources[info.id] = source
    return Inventory(
        gpus=infos,
        problems=problems,
        kfd_gpu_ids={info.id: gpu.kfd_gpu_id for info, gpu in zip(infos, gpus, strict=True)},
        compute_queues={info.id: gpu.compute_queues for info, gpu in zip(infos, gpus, strict=True)},
        product_sources=sources,
        drm_paths={info.id: drm.path for info, gpu in zip(infos, gpus, strict=True)
                   if (drm := _drm_for(gpu, context)) is not None},
    )


def _unique_by_pci(gpus: list[KfdGpu]) -> tuple[list[KfdGpu], list[DiscoveryProblem]]:
    kept: dict[PciAddress, KfdGpu] = {}
    problems = []
    for gpu in gpus:
        first = kept.setdefault(gpu.pci, gpu)
        if first is not gpu:
            problems.append(DiscoveryProblem(
                path=gpu.path,
                reason=f"same PCI address {gpu.pci} as KFD node {first.node_id}: a duplicated topology entry, skipped",
            ))
    return list(kept.values()), problems


def _partition_groups(gpus: list[KfdGpu]) -> dict[tuple[int, int, int], list[KfdGpu]]:
    groups: dict[tuple[int, int, int], list[KfdGpu]] = defaultdict(list)
    for gpu in gpus:
        groups[gpu.pci.slot].append(gpu)
    for members in groups.values():
        members.sort(key=lambda member: member.pci.function)
    return groups


def _gpu_info(gpu: KfdGpu, index: int, group: list[KfdGpu], context: _Context) -> tuple[GpuInfo, str]:
    drm = _drm_for(gpu, context)
    gfx_target = pci.gfx_target_for(gpu.gfx_target_version, gpu.device_id)
    partition = _partition(gpu, group, drm, context)
    name = product_name(device_id=gpu.device_id, revision=drm.revision if drm else None, cu_count=_whole_gpu_cus(group),
                        drm_name=drm.product_name if drm else "", ids=context.ids, gfx=pci.gfx_name(gfx_target))
    return GpuInfo(
        id=_gpu_id(gpu, partition),
        index=index,
        render_minor=gpu.render_minor,
        card=_card(gpu, drm, context),
        product=name.name,
        device_id=f"0x{gpu.device_id:04x}",
        gfx_target_version=gfx_target,
        vram_mib=_vram_mib(gpu, drm, partition),
        cu_count=gpu.cu_count,
        cu_per_wgp=pci.cu_per_wgp(gfx_target),
        pci_bdf=str(gpu.pci),
        numa=_numa(gpu, drm, context),
        hive_id=f"0x{gpu.hive_id:016x}" if gpu.hive_id else None,
        xgmi_peers=_xgmi_peers(gpu, context),
        partition=partition,
        split_count=split_count_for(gfx_target, operating_mode=context.operating_mode,
                                    pool_split_count=context.split_count),
        healthy=True,
        cu_topology=_cu_topology(gpu, gfx_target),
    ), name.source


def _cu_topology(gpu: KfdGpu, gfx_target: int) -> CuTopologyInfo | None:
    """The counts the kernel deals a CU mask over, when KFD wrote them and they describe a shape
    (rocshare.core.cu_topology); else None, and the GPU's slices are laid out as before (Packed)."""
    if CuTopology.from_kfd(num_xcc=gpu.num_xcc, array_count=gpu.array_count,
                           simd_arrays_per_engine=gpu.simd_arrays_per_engine,
                           cu_per_simd_array=gpu.cu_per_simd_array, cu_count=gpu.cu_count,
                           gfx_target_version=gfx_target) is None:
        return None
    return CuTopologyInfo(num_xcc=gpu.num_xcc, array_count=gpu.array_count,
                          simd_arrays_per_engine=gpu.simd_arrays_per_engine, cu_per_simd_array=gpu.cu_per_simd_array)


def _whole_gpu_cus(group: list[KfdGpu]) -> int:
    """CUs of the physical GPU: a partitioned GPU's partitions together."""
    return sum(member.cu_count for member in group)


def _drm_for(gpu: KfdGpu, context: _Context) -> DrmDevice | None:
    """The DRM folder of the physical GPU: partitions share their parent's (function 0)."""
    return context.drm_by_pci.get(gpu.pci) or context.drm_by_pci.get(gpu.pci.with_function(0))


def _card(gpu: KfdGpu, drm: DrmDevice | None, context: _Context) -> int | None:
    # Partitions past the first have their own card under an amdgpu_xcp platform device.
    if gpu.render_minor is not None and gpu.render_minor in context.xcp_cards:
        return context.xcp_cards[gpu.render_minor]
    exact = context.drm_by_pci.get(gpu.pci)
    return exact.card if exact else None


def _gpu_id(gpu: KfdGpu, partition: Partition | None) -> str:
    if gpu.unique_id == 0:
        return _pci_id(gpu.pci)
    suffix = f"-p{partition.index}" if partition else ""
    return f"GPU-{gpu.unique_id:016x}{suffix}"


def _pci_id(address: PciAddress) -> str:
    return f"GPU-pci-{address.domain:04x}-{address.bus:02x}-{address.device:02x}-{address.function:x}"


def _is_partitioned(group: list[KfdGpu], drm: DrmDevice | None) -> bool:
    return len(group) > 1 or (drm is not None and drm.compute_partition not in (None, "spx"))


def _partition(gpu: KfdGpu, group: list[KfdGpu], drm: DrmDevice | None, context: _Context) -> Partition | None:
    if not _is_partitioned(group, drm):
        return None
    return Partition(
        compute_mode=(drm.compute_partition if drm and drm.compute_partition else _inferred_mode(gpu, context)),
        memory_mode=drm.memory_partition if drm else None,
        index=group.index(gpu),
        parent_bdf=str(gpu.pci.with_function(0)),
    )


def _inferred_mode(gpu: KfdGpu, context: _Context) -> str:
    """Without DRM's current_compute_partition: one XCC per partition is CPX; else by count.

    The count is the largest group of the same device id on the node, because the kernel
    can hide a GPU's last partitions when it runs out of DRM minors (MI300X CPX capture).
    """
    if gpu.num_xcc == 1:
        return "cpx"
    count = _expected_partitions(gpu, context)
    return _PARTITION_MODES_BY_COUNT.get(count, f"{count}-way")


def _expected_partitions(gpu: KfdGpu, context: _Context) -> int:
    sizes: dict[tuple[int, int, int], int] = defaultdict(int)
    for node in context.nodes.values():
        if node.device_id == gpu.device_id:
            sizes[node.pci.slot] += 1
    return max(sizes.values())


def _missing_partition_problems(groups: dict[tuple[int, int, int], list[KfdGpu]],
                                context: _Context) -> list[DiscoveryProblem]:
    problems = []
    for members in groups.values():
        expected = _expected_partitions(members[0], context)
        if 1 < len(members) < expected:
            problems.append(DiscoveryProblem(
                path=members[0].path,
                reason=(f"GPU {members[0].pci.with_function(0)} shows {len(members)} of {expected} partitions: "
                        "the kernel ran out of DRM minors (it has 64); the missing ones cannot be used"),
            ))
    return problems


def _vram_mib(gpu: KfdGpu, drm: DrmDevice | None, partition: Partition | None) -> int | None:
    # KFD's figure is what the ROCm runtime hands out (on APUs it differs from DRM's carve-out);
    # DRM's total is the physical GPU's, so a partition gets its memory partition's share.
    if gpu.vram_bytes:
        return gpu.vram_bytes // MIB
    if drm is None or drm.vram_total_bytes is None:
        return None
    shares = _MEMORY_PARTITION_COUNTS.get(partition.memory_mode or "nps1", 1) if partition else 1
    return drm.vram_total_bytes // shares // MIB


def _numa(gpu: KfdGpu, drm: DrmDevice | None, context: _Context) -> int | None:
    # DRM's numa_node is authoritative when there is a DRM folder (-1 = unknown, kept unknown).
    if drm is not None:
        return drm.numa_node
    # Without one, the direct PCIe io_link to a KFD CPU node (p2p_links are paths through the
    # host, not attachment): kfd numbers CPU nodes by proximity domain, i.e. NUMA node.
    cpu_links = [link.node_to for link in gpu.links
                 if link.direct and link.link_type == LINK_TYPE_PCIE and link.node_to in context.cpus]
    return min(cpu_links) if cpu_links else None


def _xgmi_peers(gpu: KfdGpu, context: _Context) -> list[str]:
    peers = {
        str(context.nodes[link.node_to].pci)
        for link in gpu.links
        if link.link_type == LINK_TYPE_XGMI and link.node_to in context.nodes and link.node_to != gpu.node_id
    }
    return sorted(peers)
