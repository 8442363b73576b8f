"""The cgroup v2 ``dmem`` controller (Linux 6.14+): cap a pod's VRAM in the kernel too.

The root cgroup's ``dmem.capacity`` lists the regions as ``<name> <bytes>`` lines; a child's
``dmem.max`` takes ``<name> <bytes>`` writes, one region per write. Region names are read, not
guessed: a GPU's VRAM region is the one whose name has the GPU's PCI address as a path part
and ``vram`` in its last part (e.g. ``drm/0000:83:00.0/vram0``; a partition's region is its
parent GPU's). The cap is written on the pod's cgroup, which the kubelet creates after Allocate
returns, so `apply_when_ready` waits for it. Whole GPUs get no cap. A node without
``dmem.capacity`` is skipped without error. Everything takes a cgroup root, for tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from rocshare.api.allocation import AllocationRecord
from rocshare.api.models import GpuInfo

MIB = 1 << 20
log = logging.getLogger(__name__)


def dmem_available(cgroup_root: Path) -> bool:
    return (Path(cgroup_root) / "dmem.capacity").is_file()


def read_regions(cgroup_root: Path) -> dict[str, int]:
    regions: dict[str, int] = {}
    for line in (Path(cgroup_root) / "dmem.capacity").read_text().splitlines():
        name, _, size = line.strip().partition(" ")
        if name and size.strip().isdigit():
            regions[name] = int(size)
    return regions


def vram_caps_bytes(record: AllocationRecord, gpus_by_id: Mapping[str, GpuInfo]) -> dict[str, int]:
    """PCI address of each physical GPU -> bytes the pod may hold there (slices only)."""
    caps: dict[str, int] = {}
    for container in record.containers:
        for device in container.devices:
            gpu = gpus_by_id.get(device.gpu_id)
            if device.whole or gpu is None:
                continue
            bdf = gpu.partition.parent_bdf if gpu.partition else gpu.pci_bdf
            caps[bdf] = caps.get(bdf, 0) + device.memory_mib * MIB
    return caps


def region_limits(regions: Mapping[str, int], caps_by_bdf: Mapping[str, int]) -> dict[str, int]:
    limits: dict[str, int] = {}
    for name in regions:
        parts = name.split("/")
        for bdf, cap in caps_by_bdf.items():
            if bdf in parts[:-1] and "vram" in parts[-1]:
                limits[name] = cap
    return limits


def find_pod_cgroup(cgroup_root: Path, pod_uid: str) -> Path | None:
    """The pod's cgroup under either kubelet cgroup driver (``pod<uid>`` or ``pod<uid_with_underscores>.slice``)."""
    markers = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
    for top in Path(cgroup_root).glob("kubepods*"):
        for depth in ("*", "*/*"):
            for candidate in top.glob(depth):
                if candidate.is_dir() and any(candidate.name.endswith((m, f"{m}.slice")) for m in markers):
                    return candidate
    return None


def write_limits(cgroup_dir: Path, limits: Mapping[str, int]) -> None:
    target = Path(cgroup_dir) / "dmem.max"
    for region, limit_bytes in limits.items():
        with open(target, "w") as handle:  # the kernel takes one region per write
            handle.write(f"{region} {limit_bytes}\n")


async def apply_when_ready(cgroup_root: Path, pod_uid: str, limits: Mapping[str, int], *,
                           timeout_s: float = 120.0, poll_s: float = 0.5) -> bool:
    """Write `limits` once the pod's cgroup exists; False when it never appeared."""
    if not limits:
        return True
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        cgroup = find_pod_cgroup(cgroup_root, pod_uid)
        if cgroup is not None and not (cgroup / "dmem.max").exists():
            log.warning("dmem: %s has no dmem.max (controller not enabled for the pod's subtree); skipped", cgroup)
            return False
        if cgroup is not None:
            write_limits(cgroup, limits)
            log.info("dmem: capped pod %s at %s", pod_uid, dict(limits))
            return True
        await asyncio.sleep(poll_s)
    log.warning("dmem: pod %s cgroup did not appear within %.0f s; VRAM cap not written", pod_uid, timeout_s)
    return False
