"""Prometheus metrics on :9394 in the names, labels and units of HAMi's vGPU monitor
(cmd/vGPUmonitor/metrics.go, HAMi v2.10, after its March 2026 label rename), read from sysfs
and /proc on each scrape. docs/metrics.md is the contract; every hami_* series carries HAMi's
constant label zone="vGPU".

Per container (labels namespace, pod, container, vdevice_index, device_uuid):
  hami_vgpu_memory_used_bytes    sum of /sys/class/kfd/kfd/proc/<pid>/vram_<kfd gpu_id> of its processes
  hami_vgpu_memory_limit_bytes   HIP_DEVICE_MEMORY_LIMIT_<i> from the process environment, where <i> is
                                 the GPU's position in ROCR_VISIBLE_DEVICES (what the agent gave it);
                                 a whole GPU (no limit variable) reports the GPU's VRAM
  hami_container_device_utilization_ratio  percent of the GPU's CUs busy with the container's waves:
                                 100 x sum of kfd proc/<pid>/stats_<gpu_id>/cu_occupancy / CUs
Per GPU (labels node, device_index, device_uuid, device_type), from the amdgpu DRM folders:
  hami_host_gpu_memory_used_bytes                    mem_info_vram_used
  hami_host_gpu_utilization_ratio                    gpu_busy_percent (percent, 0-100)
  hami_host_gpu_memory_controller_utilization_ratio  mem_busy_percent (HAMi gives it no node label)
  rocshare_host_gpu_temperature_celsius              hwmon temp1_input (milli-degrees)
  rocshare_host_gpu_power_usage_watts                hwmon power1_average, else power1_input (microwatts)

Where a container has an account folder (docs/container-account.md, read by accounts.py) holding
the hook's usage file, its used and limit series come from there instead: the hook's exact per-container account (what its
processes hold through HIP, on every GPU position) and the limit the hook enforces (the slice's
limits file). Beside them, rocshare's own:
  rocshare_container_memory_peak_bytes   the most the container held per GPU since its account was made
  rocshare_container_processes           live processes in the container's account
  rocshare_container_accounts_unreadable accounts on the node that could not be read this scrape
Used and peak are the container's own word (it can write its usage file); the limit is the agent's.

A process is mapped to its pod through /proc/<pid>/cgroup (cgroupfs and systemd layouts;
containerd, CRI-O and docker ids), the pod to its namespace and name through the agent's
cache of this node's pods, and the container id to its name through the pod's container
statuses; where the runtime's id is not (yet) in the status, the allocation record names the
container when exactly one of the pod's containers holds that GPU. A process outside a pod,
of an unknown pod, or that vanishes mid-scrape is skipped; a missing sensor is not reported.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, decode_record
from rocshare.api.models import GpuInfo
from rocshare.api.container_account import USAGE_FILE
from rocshare_agent.accounts import AccountReading, AccountStore
from rocshare_agent.discovery import DiscoveryResult, discover, drm_devices
from rocshare_agent.dra.cdi import PreparedClaim, read_prepared
from rocshare_agent.discovery.kfd import parse_int
from rocshare_agent.discovery.sysfs import list_names, numbered_children, read_text

MONITOR_PORT = 9394
MIB = 1024 * 1024
ZONE = "vGPU"
KFD_PROC = Path("class/kfd/kfd/proc")

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
_VRAM_FILE = re.compile(r"^vram_(\d+)$")
_STATS_DIR = re.compile(r"^stats_(\d+)$")
_LIMIT = re.compile(r"^\s*(\d+)\s*([kmgKMG]?)\s*$")
_UNIT_BYTES = {"": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}

CONTAINER_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"]
HOST_LABELS = ["node", "device_index", "device_uuid", "device_type", "zone"]
HOST_MC_LABELS = ["device_index", "device_uuid", "device_type", "zone"]
ROCSHARE_HOST_LABELS = ["node", "device_index", "device_uuid", "device_type", "pci_bdf"]

PodsSource = Callable[[], Sequence[Mapping[str, Any]]]


# ---- pure -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerRef:
    pod_uid: str
    container_id: str


@dataclass(frozen=True)
class ContainerName:
    namespace: str
    pod: str
    container: str


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


def visible_position(environ: Mapping[str, str], gpu: GpuInfo, container_gpus: Sequence[GpuInfo] = ()) -> int | None:
    """The GPU's place in the container's ROCR_VISIBLE_DEVICES (its index inside the container).
    The agent names a GPU there by its ROCr UUID, or, without one (APUs, partitions), by its rank
    in KFD order among the container's GPUs (`container_gpus`; the GPU alone when unknown)."""
    visible = [entry.strip() for entry in environ.get("ROCR_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    ranked = sorted({other.id: other for other in [*container_gpus, gpu]}.values(), key=lambda other: other.index)
    rank = str([other.id for other in ranked].index(gpu.id))
    for wanted in (gpu.id, rank):
        if wanted in visible:
            return visible.index(wanted)
    return None


def memory_limit_bytes(environ: Mapping[str, str], gpu: GpuInfo, container_gpus: Sequence[GpuInfo] = ()) -> int | None:
    position = visible_position(environ, gpu, container_gpus)
    limit = environ.get(f"HIP_DEVICE_MEMORY_LIMIT_{position}") if position is not None else None
    if limit is not None:
        return parse_limit_bytes(limit)
    return gpu.vram_mib * MIB if gpu.vram_mib is not None else None


def container_name(pod: Mapping[str, Any], container_id: str, gpu_id: str) -> tuple[str, list[str]] | None:
    """(container name, the GPU ids its record gives it, in order) of a runtime container id in `pod`:
    by the pod's container statuses, else by the record when one container alone holds `gpu_id`."""
    status = pod.get("status") or {}
    devices = _record_devices(pod)
    for entry in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if (entry.get("containerID") or "").rpartition("://")[2] == container_id:
            return entry.get("name", ""), devices.get(entry.get("name", ""), [])
    holders = [(name, ids) for name, ids in devices.items() if gpu_id in ids]
    return holders[0] if len(holders) == 1 else None


def _record_devices(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    """Container name -> its GPU ids in the container's order, from the allocation record."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    try:
        record = decode_record(text) if text else None
    except AllocationError:
        return {}
    if record is None:
        return {}
    return {container.name: [device.gpu_id for device in container.devices] for container in record.containers}


def millis(text: str | None, divisor: float) -> float | None:
    value = parse_int(text)
    return value / divisor if value is not None else None


# ---- reading --------------------------------------------------------------------------------


@dataclass
class _ContainerUsage:
    used_bytes: int = 0
    limit_bytes: int | None = None
    cu_busy: int | None = None
    vdevice_index: int | None = None


@dataclass(frozen=True)
class _Process:
    pid: int
    ref: ContainerRef
    environ: dict[str, str]
    proc_dir: Path


class GpuMetricsCollector(Collector):
    """Reads everything on each scrape; nothing is cached between scrapes."""

    def __init__(self, *, sysfs_root: Path, proc_root: Path = Path("/proc"), node_name: str = "",
                 pods: PodsSource = lambda: (), discovery: Callable[[], DiscoveryResult] | None = None,
                 accounts: AccountStore | None = None, cdi_dir: Path | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self._accounts = accounts
        self._cdi_dir = cdi_dir
        self.proc_root = Path(proc_root)
        self.node_name = node_name
        self._pods = pods
        self._discovery = discovery or (lambda: discover(self.sysfs_root))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self._discovery()
        yield from self._container_metrics(result)
        yield from self._host_metrics(result)

    def _container_metrics(self, result: DiscoveryResult) -> Iterator[GaugeMetricFamily]:
        help_texts = {"used": "vGPU device memory usage in bytes", "limit": "vGPU device memory limit in bytes",
                      "busy": "Container device utilization (percent of the GPU's CUs running its waves)"}
        used = GaugeMetricFamily("hami_vgpu_memory_used_bytes", help_texts["used"], labels=CONTAINER_LABELS)
        limit = GaugeMetricFamily("hami_vgpu_memory_limit_bytes", help_texts["limit"], labels=CONTAINER_LABELS)
        busy = GaugeMetricFamily("hami_container_device_utilization_ratio", help_texts["busy"], labels=CONTAINER_LABELS)
        gpus = {gpu.id: gpu for gpu in result.gpus}
        usage_by_key = self._usage(result)
        accounted = self._account_usage(gpus)
        for key, entry in accounted.usage.items():
            kfd = usage_by_key.get(key)
            if key in accounted.counted:  # the hook's account is exact per container: it replaces KFD's sum
                entry.cu_busy = kfd.cu_busy if kfd is not None else None
                usage_by_key[key] = entry
            elif kfd is not None and entry.limit_bytes is not None:
                kfd.limit_bytes = entry.limit_bytes  # no usage file yet: KFD's use, the limit enforced now
        yield from accounted.families(self.node_name)
        for (name, gpu_id), usage in sorted(usage_by_key.items(), key=lambda item: repr(item[0])):
            gpu = gpus[gpu_id]
            labels = [name.namespace, name.pod, name.container, str(usage.vdevice_index or 0), gpu.id, ZONE]
            used.add_metric(labels, usage.used_bytes)
            if usage.limit_bytes is not None:
                limit.add_metric(labels, usage.limit_bytes)
            if usage.cu_busy is not None and gpu.cu_count:
                busy.add_metric(labels, min(100.0, 100.0 * usage.cu_busy / gpu.cu_count))
        yield from (used, limit, busy)

    def _usage(self, result: DiscoveryResult) -> dict[tuple[ContainerName, str], _ContainerUsage]:
        # KFD gpu_id 0 is "none" (CPU nodes; captures without the gpu_id file): never attributed.
        gpu_by_kfd_id = {result.kfd_gpu_ids[gpu.id]: gpu for gpu in result.gpus if result.kfd_gpu_ids.get(gpu.id)}
        gpus_by_id = {gpu.id: gpu for gpu in result.gpus}
        pods = _pods_by_uid(self._pods())
        usage: dict[tuple[ContainerName, str], _ContainerUsage] = defaultdict(_ContainerUsage)
        for process in self._processes(pods):
            pod = pods[process.ref.pod_uid]
            busy = _cu_occupancy(process.proc_dir)
            for kfd_gpu_id, used_bytes in _vram_files(process.proc_dir):
                gpu = gpu_by_kfd_id.get(kfd_gpu_id)
                found = container_name(pod, process.ref.container_id, gpu.id) if gpu is not None else None
                if gpu is None or found is None:
                    continue
                meta = pod.get("metadata") or {}
                name, record_ids = found
                container_gpus = [gpus_by_id[gpu_id] for gpu_id in record_ids if gpu_id in gpus_by_id]
                entry = usage[(ContainerName(meta.get("namespace", ""), meta.get("name", ""), name), gpu.id)]
                entry.used_bytes += used_bytes
                entry.limit_bytes = entry.limit_bytes or memory_limit_bytes(process.environ, gpu, container_gpus)
                position = visible_position(process.environ, gpu, container_gpus)
                if position is None and gpu.id in record_ids:
                    position = record_ids.index(gpu.id)
                entry.vdevice_index = position
                if kfd_gpu_id in busy:
                    entry.cu_busy = (entry.cu_busy or 0) + busy[kfd_gpu_id]
        return usage

    def _account_usage(self, gpus: Mapping[str, GpuInfo]) -> _Accounted:
        accounted = _Accounted()
        if self._accounts is None:
            return accounted
        pods = list(self._pods())
        by_uid = _pods_by_uid(pods)
        claims = self._prepared_claims()
        for reading in self._accounts.read_all():
            if reading.error is not None:
                accounted.unreadable += 1
            named = _account_owner(reading, by_uid, pods, claims)
            if named is not None:
                accounted.add(reading, named[0], [gpus.get(gpu_id) for gpu_id in named[1]])
        return accounted

    def _prepared_claims(self) -> dict[str, PreparedClaim]:
        if self._cdi_dir is None:
            return {}
        try:
            return {claim.uid: claim for claim in read_prepared(self._cdi_dir) if not isinstance(claim, str)}
        except OSError:
            return {}

    def _processes(self, pods: Mapping[str, Mapping[str, Any]]) -> Iterator[_Process]:
        for pid, proc_dir in numbered_children(self.sysfs_root / KFD_PROC):
            text = read_text(self.proc_root / str(pid) / "cgroup")
            ref = parse_cgroup(text) if text else None
            if ref is not None and ref.pod_uid in pods:
                yield _Process(pid, ref, self._environ_of(pid), proc_dir)

    def _environ_of(self, pid: int) -> dict[str, str]:
        try:
            return parse_environ((self.proc_root / str(pid) / "environ").read_bytes())
        except OSError:
            return {}

    def _host_metrics(self, result: DiscoveryResult) -> Iterator[GaugeMetricFamily]:
        families = {
            "memory": GaugeMetricFamily("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes",
                                        labels=HOST_LABELS),
            "busy": GaugeMetricFamily("hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)",
                                      labels=HOST_LABELS),
            "memory_busy": GaugeMetricFamily("hami_host_gpu_memory_controller_utilization_ratio",
                                             "GPU memory controller utilization ratio (0-100)", labels=HOST_MC_LABELS),
            "temperature": GaugeMetricFamily("rocshare_host_gpu_temperature_celsius", "GPU edge temperature",
                                             labels=ROCSHARE_HOST_LABELS),
            "power": GaugeMetricFamily("rocshare_host_gpu_power_usage_watts", "GPU power draw", labels=ROCSHARE_HOST_LABELS),
        }
        first_gpu_by_path: dict[str, GpuInfo] = {}
        for gpu in result.gpus:
            path = result.drm_paths.get(gpu.id)
            if path is not None:
                first_gpu_by_path.setdefault(path, gpu)
        for device in drm_devices(self.sysfs_root):
            gpu = first_gpu_by_path.get(device.path)
            index, uuid = (str(gpu.index), gpu.id) if gpu else ("", "")
            kind = (gpu.product if gpu else device.product_name) or "AMD"
            hami = [self.node_name, index, uuid, kind, ZONE]
            own = [self.node_name, index, uuid, kind, str(device.pci or "")]
            label_sets = {"memory": hami, "busy": hami, "memory_busy": hami[1:], "temperature": own, "power": own}
            for key, value in read_sensors(Path(device.path)).items():
                if value is not None:
                    families[key].add_metric(label_sets[key], value)
        yield from families.values()


class _Accounted:
    """What the node's accounts say, keyed as the KFD usage is (container, GPU id)."""

    def __init__(self) -> None:
        self.usage: dict[tuple[ContainerName, str], _ContainerUsage] = {}
        self.peak: dict[tuple[ContainerName, str], tuple[int, int]] = {}  # (position, bytes)
        self.processes: dict[ContainerName, int] = {}
        self.counted: set[tuple[ContainerName, str]] = set()  # keys whose account has a usage file
        self.unreadable = 0

    def add(self, reading: AccountReading, name: ContainerName, gpus: Sequence[GpuInfo | None]) -> None:
        usage, limits = reading.usage, reading.limits
        if usage is not None:
            self.processes[name] = usage.processes
        for position, gpu in enumerate(gpus):
            if gpu is None:
                continue
            limit = None  # limits unreadable: not reported
            if limits is not None and position in limits.memory_bytes:
                limit = limits.memory_bytes[position]
            elif limits is not None and gpu.vram_mib is not None:
                limit = gpu.vram_mib * MIB  # a whole GPU: its VRAM, as for KFD's series
            used = usage.used_bytes.get(position, 0) if usage is not None else 0
            self.usage[(name, gpu.id)] = _ContainerUsage(used_bytes=used, limit_bytes=limit, vdevice_index=position)
            if usage is not None:
                self.counted.add((name, gpu.id))
                self.peak[(name, gpu.id)] = (position, usage.peak_bytes.get(position, 0))

    def families(self, node_name: str) -> Iterator[GaugeMetricFamily]:
        peak = GaugeMetricFamily("rocshare_container_memory_peak_bytes",
                                 "The most the container held on the GPU since its account was made (its own word)",
                                 labels=CONTAINER_LABELS[:-1])
        processes = GaugeMetricFamily("rocshare_container_processes", "Live processes in the container's account",
                                      labels=["namespace", "pod", "container"])
        unreadable = GaugeMetricFamily("rocshare_container_accounts_unreadable",
                                       f"Account folders whose {USAGE_FILE} or limits could not be read this scrape",
                                       labels=["node"])
        for (name, gpu_id), (position, value) in sorted(self.peak.items(), key=lambda item: repr(item[0])):
            peak.add_metric([name.namespace, name.pod, name.container, str(position), gpu_id], value)
        for name, count in sorted(self.processes.items(), key=repr):
            processes.add_metric([name.namespace, name.pod, name.container], count)
        unreadable.add_metric([node_name], self.unreadable)
        yield from (peak, processes, unreadable)


def _account_owner(reading: AccountReading, pods_by_uid: Mapping[str, Mapping[str, Any]],
                   pods: Sequence[Mapping[str, Any]], claims: Mapping[str, PreparedClaim]
                   ) -> tuple[ContainerName, list[str]] | None:
    """The container an account belongs to and its GPU ids by position; None when its pod or claim is
    not (or no longer) on this node."""
    owner = reading.owner
    if owner.kind == "pod":
        pod = pods_by_uid.get(owner.uid)
        ids = _record_devices(pod).get(owner.container) if pod is not None else None
        if pod is None or ids is None:
            return None
        meta = pod.get("metadata") or {}
        return ContainerName(meta.get("namespace", ""), meta.get("name", ""), owner.container), ids
    claim = claims.get(owner.uid)
    consumer = _claim_consumer(pods, claim.namespace, claim.name) if claim is not None else None
    if claim is None or consumer is None:
        return None
    return consumer, [device.slice.gpu_id for device in claim.devices]


def _claim_consumer(pods: Sequence[Mapping[str, Any]], namespace: str, claim_name: str) -> ContainerName | None:
    """The container of a pod in `namespace` that names the ResourceClaim `claim_name` (one consumer:
    the driver refuses a claim shared by several)."""
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if meta.get("namespace") != namespace:
            continue
        entries = {entry.get("name") for entry in status.get("resourceClaimStatuses") or []
                   if entry.get("resourceClaimName") == claim_name}
        entries |= {entry.get("name") for entry in spec.get("resourceClaims") or []
                    if entry.get("resourceClaimName") == claim_name}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            named = {claim.get("name") for claim in (container.get("resources") or {}).get("claims") or []}
            if named & entries:
                return ContainerName(namespace, meta.get("name", ""), container.get("name", ""))
    return None


def _pods_by_uid(pods: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {(pod.get("metadata") or {}).get("uid", ""): pod for pod in pods}


def _vram_files(proc_dir: Path) -> Iterator[tuple[int, int]]:
    for name in list_names(proc_dir):
        match = _VRAM_FILE.match(name)
        used = parse_int(read_text(proc_dir / name)) if match else None
        if match and used is not None:
            yield int(match[1]), used


def _cu_occupancy(proc_dir: Path) -> dict[int, int]:
    """KFD gpu_id -> CUs busy with the process's waves (kernel 5.10+ `stats_<gpu_id>/cu_occupancy`)."""
    found = {}
    for name in list_names(proc_dir):
        match = _STATS_DIR.match(name)
        value = parse_int(read_text(proc_dir / name / "cu_occupancy")) if match else None
        if match and value is not None:
            found[int(match[1])] = value
    return found


def read_sensors(device_dir: Path) -> dict[str, float | None]:
    hwmon = _first_hwmon(device_dir)
    power = read_text(hwmon / "power1_average") if hwmon else None
    if power is None and hwmon:
        power = read_text(hwmon / "power1_input")  # APUs report the instant value only
    return {
        "memory": millis(read_text(device_dir / "mem_info_vram_used"), 1),
        "busy": millis(read_text(device_dir / "gpu_busy_percent"), 1),
        "memory_busy": millis(read_text(device_dir / "mem_busy_percent"), 1),
        "temperature": millis(read_text(hwmon / "temp1_input"), 1000) if hwmon else None,
        "power": millis(power, 1_000_000),
    }


def _first_hwmon(device_dir: Path) -> Path | None:
    found = numbered_children(device_dir / "hwmon", "hwmon")
    return found[0][1] if found else None


def start_monitor(*, sysfs_root: Path, proc_root: Path = Path("/proc"), port: int = MONITOR_PORT,
                  addr: str = "0.0.0.0", node_name: str = "", pods: PodsSource = lambda: (),
                  discovery: Callable[[], DiscoveryResult] | None = None, extra_collectors: Sequence[Collector] = (),
                  accounts: AccountStore | None = None, cdi_dir: Path | None = None):
    """Serve /metrics in a background thread; returns (server, thread): `server.shutdown()` stops it.
    `pods` is called from that thread: it must return a snapshot (a new list), never a live view.
    `extra_collectors` join the registry (the agent's memory-hook gauge, hook.py)."""
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs_root, proc_root=proc_root, node_name=node_name,
                                          pods=pods, discovery=discovery, accounts=accounts, cdi_dir=cdi_dir))
    for collector in extra_collectors:
        registry.register(collector)
    return start_http_server(port, addr=addr, registry=registry)
