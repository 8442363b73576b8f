"""What pods hold, read from their allocation records. Pure.

The extender's bind writes a pod's decision as the `rocshare.io/allocation`
annotation; pool and share status sum those records. Units: VRAM in MiB, compute in
percent of one GPU (so 250 is two and a half GPUs).

Rules, and why:
* A device's cores percent is ``ceil(cuCount * 100 / GPU's cuCount)``; a whole GPU or
  a slice that `reservesAllCores` counts 100, since no one else can use its compute.
  A GPU missing from the node's inventory also counts 100: never under-report.
* Per pod and GPU, use = max(largest init container, sum of app containers): init
  containers run one at a time before the app containers, the Kubernetes rule for
  effective requests.
* Pods that finished (Succeeded, Failed) hold nothing; a pod being deleted still does
  until it is gone. An undecodable record is kept, with its error, never read as free.
"""

from __future__ import annotations

import functools

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, decode_record

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
WHOLE_GPU_PCT = 100


@dataclass(frozen=True)
class DeviceUse:
    """One pod's effective hold on one GPU."""

    gpu_id: str
    memory_mib: int
    cu_count: int
    all_cores: bool  # a whole GPU or reservesAllCores


@dataclass(frozen=True)
class PodSlices:
    namespace: str
    name: str
    node: str
    devices: tuple[DeviceUse, ...] = ()
    gpus: int = 0  # amd.com/gpu as Kubernetes counts it for the pod
    error: str | None = None

    @property
    def memory_mib(self) -> int:
        return sum(device.memory_mib for device in self.devices)

    @property
    def cu_count(self) -> int:
        return sum(device.cu_count for device in self.devices)


@dataclass(frozen=True)
class GpuSummary:
    """What status needs of one inventory entry (GpuInfo)."""

    id: str
    cu_count: int
    vram_mib: int | None
    healthy: bool


def pod_slices(pod: Mapping) -> PodSlices | None:
    """The pod's hold, or None when it holds nothing (no record, or finished)."""
    meta = pod.get("metadata", {})
    text = (meta.get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    if text is None or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
        return None
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    node = (pod.get("spec") or {}).get("nodeName") or ""
    decoded = _decoded_use(text)
    if isinstance(decoded, str):
        return PodSlices(namespace=namespace, name=name, node=node, error=decoded)
    record_node, devices, gpus = decoded
    return PodSlices(namespace=namespace, name=name, node=node or record_node, devices=devices, gpus=gpus)


@functools.lru_cache(maxsize=4096)
def _decoded_use(text: str) -> tuple[str, tuple[DeviceUse, ...], int] | str:
    """A record's use, or the decoding error. Memoised: every pod event reaches several
    handlers and indexes, and a record never changes once written."""
    try:
        record = decode_record(text)
    except AllocationError as error:
        return str(error)
    devices, gpus = effective_use(record)
    return record.node, devices, gpus


def effective_use(record: AllocationRecord) -> tuple[tuple[DeviceUse, ...], int]:
    """Per GPU: max(largest init container, sum of app containers); and the pod's GPU count."""
    app: dict[str, DeviceUse] = {}
    init: dict[str, DeviceUse] = {}
    app_gpus = init_gpus = 0
    for container in record.containers:
        for device in container.devices:
            all_cores = device.whole or device.reserves_all_cores
            use = DeviceUse(device.gpu_id, device.memory_mib, device.cu_count, all_cores)
            if container.init:
                init[device.gpu_id] = _larger(init.get(device.gpu_id), use)
            else:
                app[device.gpu_id] = _added(app.get(device.gpu_id), use)
        if container.init:
            init_gpus = max(init_gpus, len(container.devices))
        else:
            app_gpus += len(container.devices)
    devices = tuple(_larger(app.get(gpu_id), init.get(gpu_id)) for gpu_id in {**app, **init})
    return devices, max(app_gpus, init_gpus)


def _added(total: DeviceUse | None, use: DeviceUse) -> DeviceUse:
    if total is None:
        return use
    return DeviceUse(use.gpu_id, total.memory_mib + use.memory_mib, total.cu_count + use.cu_count,
                     total.all_cores or use.all_cores)


def _larger(left: DeviceUse | None, right: DeviceUse | None) -> DeviceUse:
    if left is None or right is None:
        return left or right  # type: ignore[return-value]
    return DeviceUse(left.gpu_id, max(left.memory_mib, right.memory_mib), max(left.cu_count, right.cu_count),
                     left.all_cores or right.all_cores)


def cores_pct(device: DeviceUse, gpu_cu_count: int | None) -> int:
    """Percent of one GPU's compute this device use holds, rounded up."""
    if device.all_cores or not gpu_cu_count:
        return WHOLE_GPU_PCT
    return min(WHOLE_GPU_PCT, -(-device.cu_count * 100 // gpu_cu_count))


def pod_cores_pct(pod: PodSlices, gpu_cu_counts: Mapping[str, int]) -> int:
    """Sum over the pod's GPUs; `gpu_cu_counts` maps the pod's node's GPU ids to their CU counts."""
    return sum(cores_pct(device, gpu_cu_counts.get(device.gpu_id)) for device in pod.devices)


def gpu_summaries(gpus: Iterable[Mapping]) -> tuple[GpuSummary, ...]:
    """From AmdGpuNode status.gpus entries; missing numbers read as 0 / unknown."""
    return tuple(GpuSummary(id=str(gpu.get("id", "")), cu_count=int(gpu.get("cuCount") or 0),
                            vram_mib=gpu.get("vramMiB"), healthy=bool(gpu.get("healthy")))
                 for gpu in gpus)
