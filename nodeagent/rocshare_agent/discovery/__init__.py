"""GPU discovery: what AMD GPUs and partitions a node has, read from a sysfs root.

`discover(sysfs_root)` is the one entry point. It reads through scan.py/sysfs.py (the only
I/O), parses with the pure kfd.py/drm.py, and assembles with the pure assemble.py. It never
raises on a file's content: a broken entry becomes a `DiscoveryProblem` naming its path and
why, and every other GPU still publishes. Health is not decided here (see health.py):
every GPU comes back `healthy=True`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rocshare.api.models import DiscoveryProblem, GpuInfo, OperatingMode
from rocshare_agent.discovery.assemble import Inventory, assemble, split_count_for
from rocshare_agent.discovery.drm import DrmDevice, is_amdgpu, parse_drm_device
from rocshare_agent.discovery.kfd import KfdCpu, KfdGpu, KfdParseError, parse_node
from rocshare_agent.discovery.names import amdgpu_ids_paths, load_amdgpu_ids, product_name
from rocshare_agent.discovery.scan import kfd_nodes_dir, scan_drm, scan_kfd, scan_xcp_cards

__all__ = ["DiscoveryResult", "discover", "drm_devices", "split_count_for"]


@dataclass(frozen=True)
class DiscoveryResult:
    gpus: list[GpuInfo] = field(default_factory=list)
    problems: list[DiscoveryProblem] = field(default_factory=list)
    kfd_gpu_ids: dict[str, int] = field(default_factory=dict)
    """GpuInfo.id -> KFD gpu_id, the suffix of /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>."""
    drm_paths: dict[str, str] = field(default_factory=dict)
    """GpuInfo.id -> the DRM device folder holding its sensors (a partition's is its GPU's)."""
    compute_queues: dict[str, int] = field(default_factory=dict)
    """GpuInfo.id -> KFD num_cp_queues (HAMi's custominfo.computeQueues)."""
    product_sources: dict[str, str] = field(default_factory=dict)
    """GpuInfo.id -> where its product name came from (names.SOURCE_*)."""

    def to_json_dict(self) -> dict:
        # Explicit nulls (vramMiB, numa): "unknown" must be visible in the CLI output.
        return {"gpus": [{**gpu.model_dump(by_alias=True, mode="json"), "productSource": self.product_sources.get(gpu.id, "")}
                         for gpu in self.gpus],
                "problems": [problem.to_json_dict() for problem in self.problems]}


def discover(sysfs_root: Path, dev_root: Path | None = None, *, operating_mode: OperatingMode = OperatingMode.CU,
             split_count: int = 0) -> DiscoveryResult:
    """Every GPU or partition under `sysfs_root`, in KFD order. With `dev_root`, device-file
    health is applied too (a device node that cannot be opened marks its GPU unhealthy)."""
    sysfs_root = Path(sysfs_root)
    nodes, problems = _kfd_nodes(sysfs_root)
    drm = drm_devices(sysfs_root)
    ids, _path = load_amdgpu_ids(amdgpu_ids_paths())
    inventory = assemble(nodes, drm, xcp_cards=scan_xcp_cards(sysfs_root), operating_mode=operating_mode,
                         split_count=split_count, ids=ids)
    gpus = inventory.gpus
    if dev_root is not None:
        from rocshare_agent.health import apply_device_file_health

        gpus = apply_device_file_health(gpus, Path(dev_root))
    return DiscoveryResult(gpus=gpus, problems=problems + inventory.problems + _drm_without_kfd(drm, inventory, ids),
                           kfd_gpu_ids=inventory.kfd_gpu_ids, drm_paths=inventory.drm_paths,
                           compute_queues=inventory.compute_queues, product_sources=inventory.product_sources)


def drm_devices(sysfs_root: Path) -> list[DrmDevice]:
    return [parse_drm_device(raw) for raw in scan_drm(Path(sysfs_root)) if is_amdgpu(raw)]


def _kfd_nodes(sysfs_root: Path) -> tuple[list[KfdGpu | KfdCpu], list[DiscoveryProblem]]:
    nodes_dir = kfd_nodes_dir(sysfs_root)
    if not nodes_dir.is_dir():
        return [], [DiscoveryProblem(path=str(nodes_dir), reason="no KFD topology: amdgpu not loaded, or no GPU ROCm can use")]
    nodes: list[KfdGpu | KfdCpu] = []
    problems = []
    for raw in scan_kfd(sysfs_root):
        try:
            node = parse_node(raw)
        except KfdParseError as error:
            problems.append(DiscoveryProblem(path=raw.path, reason=str(error)))
            continue
        if node is not None:
            nodes.append(node)
    return nodes, problems


def _drm_without_kfd(drm: list[DrmDevice], inventory: Inventory, ids) -> list[DiscoveryProblem]:
    used = set(inventory.drm_paths.values())
    problems = []
    for device in drm:
        if device.path in used:
            continue
        name = product_name(device_id=device.device_id or 0, revision=device.revision, drm_name=device.product_name,
                            ids=ids).name
        problems.append(DiscoveryProblem(path=device.path, reason=f"amdgpu card{device.card} ({device.pci}, {name}) "
                                                                  "has no KFD node: not usable for compute"))
    return problems
