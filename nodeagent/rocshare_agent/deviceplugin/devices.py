"""The device IDs the kubelet sees, and the GPU each one stands for.

In ``cu`` mode a GPU is offered as ``splitCount`` interchangeable IDs ``<gpu id>::<k>``, so the
node's allocatable ``amd.com/gpu`` is GPUs x splitCount and a pod asking for ``amd.com/gpu: 2``
takes two IDs (which the scheduler's record maps to two distinct GPUs). In ``partition`` mode
each partition is one whole device whose ID is the partition's GpuInfo id. The mode is read
from the inventory itself: discovery gives every device ``splitCount`` 1 in partition mode, and
any device with ``splitCount`` 1 is offered as itself; one source of truth, no second setting. An unhealthy GPU's
IDs stay listed as Unhealthy (capacity keeps them, allocatable drops), so that the kubelet
notices the change at once and a GPU that recovers comes back under the same IDs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rocshare.api.models import GpuInfo

SLICE_SEPARATOR = "::"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class PluginDevice:
    """One entry of ListAndWatch."""

    id: str
    gpu_id: str
    health: str
    numa: int | None


def slice_id(gpu_id: str, k: int) -> str:
    return f"{gpu_id}{SLICE_SEPARATOR}{k}"


def gpu_of(device_id: str) -> str:
    """The GpuInfo id a kubelet device ID stands for (partition IDs are GPU ids already)."""
    gpu_id, _, _ = device_id.partition(SLICE_SEPARATOR)
    return gpu_id


def plugin_devices(gpus: Sequence[GpuInfo]) -> list[PluginDevice]:
    """Every device ID of the node, in KFD order then slice order."""
    devices: list[PluginDevice] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        health = HEALTHY if gpu.healthy else UNHEALTHY
        if gpu.split_count == 1:
            devices.append(PluginDevice(gpu.id, gpu.id, health, gpu.numa))
            continue
        devices.extend(PluginDevice(slice_id(gpu.id, k), gpu.id, health, gpu.numa) for k in range(gpu.split_count))
    return devices
