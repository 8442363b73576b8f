"""The world tests/e2e/test_dashboards.py checks the dashboards against: the GPUs the agents
published, the allocation records of the running pods, and the simulated hardware the monitors
read — KFD per-process files and /proc entries played for every container and GPU, synthetic
KFD gpu_id files and DRM folders for the captures that lack them (each says it is synthetic).
"""

from __future__ import annotations

import hashlib
import math
import shutil
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocshare.api.allocation import AllocationRecord
from rocshare_agent.discovery import discover
from tests.e2e.fleet import runtime_of

MIB = 2**20

PodKey = tuple[str, str]  # (namespace, name)
SliceKey = tuple[str, str, str, str]  # (namespace, pod, container, GPU id)


@dataclass(frozen=True)
class Gpu:
    node: str
    id: str
    index: int
    offered_mib: int  # VRAM times the pool's deviceMemoryScaling where the GPU can oversubscribe
    cu_count: int
    gfx_target_version: int
    product: str


@dataclass
class Truth:
    """What every series must say, from specs, records, the published inventory and the files written."""

    gpus: dict[str, Gpu] = field(default_factory=dict)  # by (node-unique) GPU id
    records: dict[PodKey, AllocationRecord] = field(default_factory=dict)
    used_bytes: dict[SliceKey, int] = field(default_factory=dict)
    limit_bytes: dict[SliceKey, int] = field(default_factory=dict)
    vdevice: dict[SliceKey, int] = field(default_factory=dict)
    busy_cus: dict[SliceKey, int] = field(default_factory=dict)
    host: dict[str, dict[str, float]] = field(default_factory=dict)  # GPU id -> sensor -> value
    quota_limits: dict[str, dict[str, int]] = field(default_factory=dict)  # namespace -> quota name -> limit

    def slices(self) -> Iterator[tuple[PodKey, int, str, object]]:
        for key, record in sorted(self.records.items()):
            for index, container in enumerate(record.containers):
                for device in container.devices:
                    yield key, index, container.name, device

    def gpu(self, node: str, gpu_id: str) -> Gpu:
        return self.gpus[f"{node}/{gpu_id}"]

    def on(self, gpu: Gpu) -> list:
        return [device for key, _i, _c, device in self.slices()
                if device.gpu_id == gpu.id and self.records[key].node == gpu.node]

    def allocated_mib(self, gpu: Gpu) -> int:
        return sum(device.memory_mib for device in self.on(gpu))

    def cores_pct(self, gpu: Gpu) -> float:
        """ceil(CUs held / CUs x 100): a whole GPU or a slice that reserves every CU holds them all."""
        held: set[int] = set()
        for device in self.on(gpu):
            if device.whole or device.reserves_all_cores:
                held.update(range(gpu.cu_count))
            for start, end in device.cu_ranges:
                held.update(range(start, end + 1))
        return float(math.ceil(len(held) * 100 / gpu.cu_count))


def check_records(truth: Truth, pods: dict[PodKey, dict]) -> None:
    """The records are what the sample pods ask (DESIGN.md section 3): MiB, or percent of the
    GPU's registered VRAM (floor); CUs ceil(total x percent), whole WGPs of 2 on RDNA."""
    for key, pod in pods.items():
        record = truth.records[key]
        for container, spec in zip(record.containers, pod["spec"]["containers"]):
            limits = spec.get("resources", {}).get("limits", {})
            for device in container.devices:
                gpu = truth.gpu(record.node, device.gpu_id)
                if "amd.com/gpumem" in limits:
                    assert device.memory_mib == int(limits["amd.com/gpumem"]), key
                elif "amd.com/gpumem-percentage" in limits:
                    assert device.memory_mib == gpu.offered_mib * int(limits["amd.com/gpumem-percentage"]) // 100, key
                if "amd.com/gpucores" in limits:
                    cus = math.ceil(gpu.cu_count * int(limits["amd.com/gpucores"]) / 100)
                    if gpu.gfx_target_version >= 100000:
                        cus = min(gpu.cu_count, cus + cus % 2)
                    assert device.cu_count == cus, key


# ---- simulated hardware -----------------------------------------------------------------------------


def writable_copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    for path in [target, *target.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def synthetic_gpu_ids(sysfs: Path) -> None:
    """KFD gpu_id files for captures that lack them (synthetic; a real node has one per GPU node):
    the per-process files vram_<gpu_id> are named by them."""
    for node in (sysfs / "class" / "kfd" / "kfd" / "topology" / "nodes").iterdir():
        properties = (node / "properties").read_text().splitlines()
        simd_count = next((int(line.split()[1]) for line in properties if line.startswith("simd_count ")), 0)
        if simd_count > 0 and not (node / "gpu_id").exists():
            (node / "gpu_id").write_text(f"{40000 + int(node.name)}\n")


def synthetic_drm(sysfs: Path) -> None:
    """DRM device folders for the KFD-only MI210 capture (synthetic): one per GPU, by PCI address."""
    for card, gpu in enumerate(discover(sysfs).gpus):
        device = sysfs / "class" / "drm" / f"card{card}" / "device"
        (device / "hwmon" / "hwmon0").mkdir(parents=True)
        files = {"uevent": f"DRIVER=amdgpu\nPCI_ID=1002:740F\nPCI_SLOT_NAME={gpu.pci_bdf}\n",
                 "device": "0x740f\n", "revision": "0x02\n", "numa_node": f"{gpu.numa}\n",
                 "mem_info_vram_total": f"{gpu.vram_mib * MIB}\n", "mem_info_vram_used": "0\n",
                 "gpu_busy_percent": f"{10 + 10 * card}\n", "mem_busy_percent": f"{5 + card}\n",
                 "hwmon/hwmon0/temp1_input": f"{(40 + card) * 1000}\n",
                 "hwmon/hwmon0/power1_average": f"{(100 + 10 * card) * 1_000_000}\n"}
        for name, text in files.items():
            (device / name).write_text(text)


def play_processes(truth: Truth, node: str, sysfs: Path, proc: Path, pods: dict[PodKey, dict]) -> dict[str, int]:
    """One process per container and GPU of the pods on `node`, using half of its slice's VRAM and
    half of its CUs, as the KFD and /proc files of a real node would show it. Returns VRAM used per GPU."""
    found = discover(sysfs)
    kfd_ids, real_vram = found.kfd_gpu_ids, {gpu.id: gpu.vram_mib or 0 for gpu in found.gpus}
    used_per_gpu: dict[str, int] = defaultdict(int)
    for pid, (key, index, container, device) in enumerate(truth.slices(), start=1000):
        if truth.records[key].node != node:
            continue
        pod = pods[key]
        uid = pod["metadata"]["uid"]
        container_id = hashlib.sha256(f"{uid}/{container}".encode()).hexdigest()
        envs = runtime_of(pod)[container]["envs"]
        # The GPU's place in the container: its ROCr UUID in ROCR_VISIBLE_DEVICES, or (partitions,
        # APUs) its rank in KFD order among the container's GPUs (DESIGN.md section 4).
        visible = envs["ROCR_VISIBLE_DEVICES"].split(",")
        ranked = sorted((truth.gpu(node, other.gpu_id) for other in truth.records[key].containers[index].devices),
                        key=lambda gpu: gpu.index)
        rank = [gpu.id for gpu in ranked].index(device.gpu_id)
        position = visible.index(device.gpu_id) if device.gpu_id in visible else visible.index(str(rank))
        kfd = sysfs / "class/kfd/kfd/proc" / str(pid)
        (kfd / f"stats_{kfd_ids[device.gpu_id]}").mkdir(parents=True)
        used, busy = device.memory_mib * MIB // 2, max(1, device.cu_count // 2)
        (kfd / f"vram_{kfd_ids[device.gpu_id]}").write_text(f"{used}\n")
        (kfd / f"stats_{kfd_ids[device.gpu_id]}" / "cu_occupancy").write_text(f"{busy}\n")
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n")
        (proc / str(pid) / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in envs.items()))
        slice_key = (*key, container, device.gpu_id)
        truth.used_bytes[slice_key], truth.busy_cus[slice_key], truth.vdevice[slice_key] = used, busy, position
        limit = envs.get(f"HIP_DEVICE_MEMORY_LIMIT_{position}")
        # No limit variable (a whole GPU): the monitor reports the GPU's real VRAM, none when unknown.
        if limit or real_vram[device.gpu_id]:
            truth.limit_bytes[slice_key] = int(limit.rstrip("m")) * MIB if limit else real_vram[device.gpu_id] * MIB
        used_per_gpu[device.gpu_id] += used
    return used_per_gpu


def set_vram_used(sysfs: Path, used_per_gpu: dict[str, int]) -> None:
    """The synthetic DRM folders show what the processes use."""
    by_bdf = {gpu.pci_bdf: gpu.id for gpu in discover(sysfs).gpus}
    for device in (sysfs / "class" / "drm").glob("card*/device"):
        bdf = (device / "uevent").read_text().split("PCI_SLOT_NAME=")[1].split()[0]
        (device / "mem_info_vram_used").write_text(f"{used_per_gpu.get(by_bdf[bdf], 0)}\n")


def read_host(truth: Truth, sysfs: Path, node: str) -> None:
    """The sensor files as they are now (captured or synthetic), for GPUs that have a DRM folder."""
    result, seen = discover(sysfs), set()
    for gpu in result.gpus:
        path = result.drm_paths.get(gpu.id)
        if path is None or path in seen:
            continue  # no DRM folder; or a partition whose GPU's folder was counted with partition 0
        seen.add(path)
        path = Path(path)
        hwmon = sorted((path / "hwmon").iterdir())[0]
        power = hwmon / "power1_average" if (hwmon / "power1_average").exists() else hwmon / "power1_input"
        truth.host[f"{node}/{gpu.id}"] = {"used": int((path / "mem_info_vram_used").read_text()),
                                          "busy": float((path / "gpu_busy_percent").read_text()),
                                          "temperature": int((hwmon / "temp1_input").read_text()) / 1000,
                                          "power": int(power.read_text()) / 1_000_000}




def held_pct(t: Truth, node: str, device) -> int:
    """Compute a slice holds in quota units (DESIGN.md section 3, the record's coresPct): 100 for a
    whole GPU or an all-cores slice, the gpucores asked, 0 for a Shared slice without gpucores."""
    if device.whole or device.reserves_all_cores:
        return 100
    if device.cores_pct is not None:
        return device.cores_pct
    if not device.cu_ranges:
        return 0
    return math.ceil(device.cu_count * 100 / t.gpu(node, device.gpu_id).cu_count)
