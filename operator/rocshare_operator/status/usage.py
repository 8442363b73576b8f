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
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from rocshare.api.allocation import AllocationError, AllocationRecord
from rocshare_operator.feed.cluster_facts import (
    GpuSummary,
    PodFacts,
    decoded_record,
    gpu_summaries,
    pod_facts,
)

__all__ = ["GpuSummary", "gpu_summaries"]  # re-exported: status code reads them with pods' use

WHOLE_GPU_PCT = 100


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One pod's effective hold on one GPU."""

    gpu_id: str
    memory_mib: int
    cu_count: int
    all_cores: bool  # a whole GPU or reservesAllCores


@dataclass(frozen=True, slots=True)
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


def pod_slices(pod: Mapping) -> PodSlices | None:
    """The hold of a pod object, or None when it holds nothing (no record, or finished)."""
    return slices_of(pod_facts(pod))


def slices_of(pod: PodFacts) -> PodSlices | None:
    """The pod's hold, or None when it holds nothing (no record, or finished)."""
    if pod.allocation is None or pod.finished:
        return None
    decoded = _decoded_use(pod.allocation)
    if isinstance(decoded, str):
        return PodSlices(namespace=pod.namespace, name=pod.name, node=pod.node, error=decoded)
    record_node, devices, gpus = decoded
    return PodSlices(namespace=pod.namespace, name=pod.name, node=pod.node or record_node, devices=devices,
                     gpus=gpus)


@functools.lru_cache(maxsize=4096)
def _decoded_use(text: str) -> tuple[str, tuple[DeviceUse, ...], int] | str:
    """A record's use, or the decoding error. Memoised: a pod's record is read again on each
    of its status changes, and a record never changes once written."""
    try:
        record = decoded_record(text)
    except AllocationError as error:
        return str(error)
    devices, gpus = effective_use(record)
    return sys.intern(record.node), devices, gpus


def effective_use(record: AllocationRecord) -> tuple[tuple[DeviceUse, ...], int]:
    """Per GPU: max(largest init container, sum of app containers); and the pod's GPU count."""
    app: dict[str, DeviceUse] = {}
    init: dict[str, DeviceUse] = {}
    app_gpus = init_gpus = 0
    for container in record.containers:
        for device in container.devices:
            all_cores = device.whole or device.reserves_all_cores
            use = DeviceUse(sys.intern(device.gpu_id), device.memory_mib, device.cu_count, all_cores)
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


class SliceIndex:
    """The holds of live pods, by node and by namespace: what pool and share status sum.

    Mutable, owned by its caller, rebuilt from the pod watch; only pods that hold something
    are kept (a pod without a record costs nothing here).
    """

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, PodSlices]] = {}
        self._by_node: dict[str, set[PodSlices]] = {}

    def put(self, namespace: str, name: str, held: PodSlices | None) -> PodSlices | None:
        """Record what the pod holds now (None: nothing); returns what it held before."""
        in_namespace = self._by_namespace.get(namespace, {})
        before = in_namespace.pop(name, None)
        if before is not None:
            on_node = self._by_node[before.node]
            on_node.discard(before)
            if not on_node:
                del self._by_node[before.node]
            if not in_namespace:
                del self._by_namespace[namespace]
        if held is not None:
            self._by_namespace.setdefault(namespace, {})[held.name] = held
            self._by_node.setdefault(held.node, set()).add(held)
        return before

    def on_node(self, node: str) -> list[PodSlices]:
        return list(self._by_node.get(node, ()))

    def in_namespace(self, namespace: str) -> list[PodSlices]:
        return list(self._by_namespace.get(namespace, {}).values())
