"""Prometheus metrics on :9394 with HAMi's names, read from sysfs and /proc on each scrape.

Per container (labels poduid, containerid, deviceuuid, deviceidx):
  hami_vgpu_memory_used_bytes   sum of /sys/class/kfd/kfd/proc/<pid>/vram_<kfd gpu_id> of its processes
  hami_vgpu_memory_limit_bytes  HIP_DEVICE_MEMORY_LIMIT_<i> from the process environment, where <i> is
                                the GPU's position in ROCR_VISIBLE_DEVICES (what the agent gave it);
                                a whole GPU (no limit variable) reports the GPU's VRAM
Per GPU (labels deviceidx, deviceuuid, devicetype, pcibdf), from the amdgpu DRM folders:
  hami_host_gpu_memory_used_bytes     mem_info_vram_used
  hami_host_gpu_utilization_ratio     gpu_busy_percent / 100
  hami_host_gpu_temperature_celsius   hwmon temp1_input (milli-degrees)
  hami_host_gpu_power_usage_watts     hwmon power1_average, else power1_input (microwatts)

Processes are mapped to pods through /proc/<pid>/cgroup under a configurable proc root
(cgroupfs and systemd layouts; containerd, CRI-O and docker ids). A process that is not in
a pod, or vanishes mid-scrape, is skipped; a missing sensor is just not reported.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.api.models import GpuInfo
from rocshare_agent.discovery import DiscoveryResult, discover, drm_devices
from rocshare_agent.discovery.kfd import parse_int
from rocshare_agent.discovery.sysfs import list_names, numbered_children, read_text

MONITOR_PORT = 9394
MIB = 1024 * 1024
KFD_PROC = Path("class/kfd/kfd/proc")

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
_VRAM_FILE = re.compile(r"^vram_(\d+)$")
_LIMIT = re.compile(r"^\s*(\d+)\s*([kmgKMG]?)\s*$")
_UNIT_BYTES = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}

CONTAINER_LABELS = ["poduid", "containerid", "deviceuuid", "deviceidx"]
HOST_LABELS = ["deviceidx", "deviceuuid", "devicetype", "pcibdf"]


# ---- pure -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerRef:
    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod and container of a /proc/<pid>/cgroup, v1 or v2; None outside Kubernetes pods."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        pod = _POD_UID.search(path)
        container = _CONTAINER_ID.search(path.rstrip("/").rsplit("/", 1)[-1])
        if pod and container:
            return ContainerRef(pod[1].replace("_", "-"), container[1])
    return None


def parse_environ(data: bytes) -> dict[str, str]:
    pairs = (item.decode("utf-8", errors="replace").partition("=") for item in data.split(b"\0") if item)
    return {key: value for key, sep, value in pairs if sep}


def parse_limit_bytes(text: str) -> int | None:
    """HIP_DEVICE_MEMORY_LIMIT_<i> values: `<n>m` (MiB, what the agent writes), k, g, or bytes."""
    match = _LIMIT.match(text)
    return int(match[1]) * _UNIT_BYTES[match[2].lower()] if match else None


def memory_limit_bytes(environ: dict[str, str], gpu: GpuInfo) -> int | None:
    visible = [entry.strip() for entry in environ.get("ROCR_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    for position, entry in enumerate(visible):
        if entry in (gpu.id, str(gpu.index)):
            limit = environ.get(f"HIP_DEVICE_MEMORY_LIMIT_{position}")
            if limit is not None:
                return parse_limit_bytes(limit)
    return gpu.vram_mib * MIB if gpu.vram_mib is not None else None


def millis(text: str | None, divisor: float) -> float | None:
    value = parse_int(text)
    return value / divisor if value is not None else None


# ---- reading --------------------------------------------------------------------------------


@dataclass
class _ContainerUsage:
    used_bytes: int = 0
    limit_bytes: int | None = None


class GpuMetricsCollector(Collector):
    """Reads everything on each scrape; nothing is cached between scrapes."""

    def __init__(self, *, sysfs_root: Path, proc_root: Path = Path("/proc"),
                 discovery: Callable[[], DiscoveryResult] | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.proc_root = Path(proc_root)
        self._discovery = discovery or (lambda: discover(self.sysfs_root))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self._discovery()
        yield from self._container_metrics(result)
        yield from self._host_metrics(result)

    def _container_metrics(self, result: DiscoveryResult) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily("hami_vgpu_memory_used_bytes", "VRAM used by a container on a GPU", labels=CONTAINER_LABELS)
        limit = GaugeMetricFamily("hami_vgpu_memory_limit_bytes", "VRAM a container may use on a GPU", labels=CONTAINER_LABELS)
        gpus = {gpu.id: gpu for gpu in result.gpus}
        for (ref, gpu_id), usage in self._usage(result).items():
            gpu = gpus[gpu_id]
            labels = [ref.pod_uid, ref.container_id, gpu.id, str(gpu.index)]
            used.add_metric(labels, usage.used_bytes)
            if usage.limit_bytes is not None:
                limit.add_metric(labels, usage.limit_bytes)
        yield used
        yield limit

    def _usage(self, result: DiscoveryResult) -> dict[tuple[ContainerRef, str], _ContainerUsage]:
        gpu_by_kfd_id = {result.kfd_gpu_ids[gpu.id]: gpu for gpu in result.gpus if gpu.id in result.kfd_gpu_ids}
        usage: dict[tuple[ContainerRef, str], _ContainerUsage] = defaultdict(_ContainerUsage)
        for pid, proc_dir in numbered_children(self.sysfs_root / KFD_PROC):
            ref = self._container_of(pid)
            if ref is None:
                continue
            environ = self._environ_of(pid)
            for kfd_gpu_id, used_bytes in _vram_files(proc_dir):
                gpu = gpu_by_kfd_id.get(kfd_gpu_id)
                if gpu is not None:
                    entry = usage[(ref, gpu.id)]
                    entry.used_bytes += used_bytes
                    entry.limit_bytes = entry.limit_bytes or memory_limit_bytes(environ, gpu)
        return usage

    def _container_of(self, pid: int) -> ContainerRef | None:
        text = read_text(self.proc_root / str(pid) / "cgroup")
        return parse_cgroup(text) if text else None

    def _environ_of(self, pid: int) -> dict[str, str]:
        try:
            return parse_environ((self.proc_root / str(pid) / "environ").read_bytes())
        except OSError:
            return {}

    def _host_metrics(self, result: DiscoveryResult) -> Iterator[GaugeMetricFamily]:
        families = {
            "memory": GaugeMetricFamily("hami_host_gpu_memory_used_bytes", "VRAM used on the GPU", labels=HOST_LABELS),
            "busy": GaugeMetricFamily("hami_host_gpu_utilization_ratio", "GPU busy fraction (0-1)", labels=HOST_LABELS),
            "temperature": GaugeMetricFamily("hami_host_gpu_temperature_celsius", "GPU edge temperature", labels=HOST_LABELS),
            "power": GaugeMetricFamily("hami_host_gpu_power_usage_watts", "GPU power draw", labels=HOST_LABELS),
        }
        first_gpu_by_path = {}
        for gpu in result.gpus:
            path = result.drm_paths.get(gpu.id)
            if path is not None:
                first_gpu_by_path.setdefault(path, gpu)
        for device in drm_devices(self.sysfs_root):
            gpu = first_gpu_by_path.get(device.path)
            labels = [str(gpu.index) if gpu else "", gpu.id if gpu else "", gpu.product if gpu else device.product_name,
                      str(device.pci or "")]
            for key, value in read_sensors(Path(device.path)).items():
                if value is not None:
                    families[key].add_metric(labels, value)
        yield from families.values()


def _vram_files(proc_dir: Path) -> Iterator[tuple[int, int]]:
    for name in list_names(proc_dir):
        match = _VRAM_FILE.match(name)
        used = parse_int(read_text(proc_dir / name)) if match else None
        if match and used is not None:
            yield int(match[1]), used


def read_sensors(device_dir: Path) -> dict[str, float | None]:
    hwmon = _first_hwmon(device_dir)
    busy_percent = parse_int(read_text(device_dir / "gpu_busy_percent"))
    power = read_text(hwmon / "power1_average") if hwmon else None
    if power is None and hwmon:
        power = read_text(hwmon / "power1_input")  # APUs report the instant value only
    return {
        "memory": millis(read_text(device_dir / "mem_info_vram_used"), 1),
        "busy": busy_percent / 100 if busy_percent is not None else None,
        "temperature": millis(read_text(hwmon / "temp1_input"), 1000) if hwmon else None,
        "power": millis(power, 1_000_000),
    }


def _first_hwmon(device_dir: Path) -> Path | None:
    found = numbered_children(device_dir / "hwmon", "hwmon")
    return found[0][1] if found else None


def start_monitor(*, sysfs_root: Path, proc_root: Path = Path("/proc"), port: int = MONITOR_PORT,
                  addr: str = "0.0.0.0", discovery: Callable[[], DiscoveryResult] | None = None):
    """Serve /metrics in a background thread; returns (server, thread): `server.shutdown()` stops it."""
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs_root, proc_root=proc_root, discovery=discovery))
    return start_http_server(port, addr=addr, registry=registry)
