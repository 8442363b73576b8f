"""The extended resource names a GPU is offered under. Pure.

``single`` naming (the default): every GPU, slice or partition is ``amd.com/gpu``.
``mixed`` naming, as AMD's device plugin does it (``-resource_naming_strategy=mixed``): in
partition mode each compute partition is offered under a name for its mode,
``amd.com/<compute>_<memory>`` (``amd.com/cpx_nps4``, ``amd.com/spx_nps1``), so a pod asks for the
kind of partition it wants and a node with GPUs in several modes offers one name per mode.
A partition whose memory mode is unknown is ``amd.com/<compute>``. CU slices are always
``amd.com/gpu``.
"""

from __future__ import annotations

import re

from collections.abc import Iterable

from rocshare.api.models import GpuInfo, OperatingMode, ResourceNaming, Sharing

GPU_RESOURCE = "amd.com/gpu"
COMPUTE_MODES = ("spx", "dpx", "tpx", "qpx", "cpx")
MEMORY_MODES = ("nps1", "nps2", "nps4", "nps8")
PARTITION_RESOURCE = re.compile(rf"^amd\.com/({'|'.join(COMPUTE_MODES)})(?:_({'|'.join(MEMORY_MODES)}))?$")
PARTITION_RESOURCES = tuple(f"amd.com/{compute}{suffix}" for compute in COMPUTE_MODES
                            for suffix in ("", *(f"_{memory}" for memory in MEMORY_MODES)))
"""Every name mixed naming can give a partition (for the scheduler's managedResources)."""


def is_partition_resource(name: str) -> bool:
    return PARTITION_RESOURCE.match(name) is not None


def is_gpu_resource(name: str) -> bool:
    """A resource that counts devices: amd.com/gpu or a partition name."""
    return name == GPU_RESOURCE or is_partition_resource(name)


def resource_for(gpu: GpuInfo, *, naming: ResourceNaming, operating_mode: OperatingMode) -> str:
    """The resource name `gpu` is offered under on a node with these settings."""
    if naming is ResourceNaming.MIXED and operating_mode is OperatingMode.PARTITION and gpu.partition is not None:
        compute = gpu.partition.compute_mode.lower()
        memory = (gpu.partition.memory_mode or "").lower()
        name = f"amd.com/{compute}_{memory}" if memory else f"amd.com/{compute}"
        if is_partition_resource(name):
            return name
    return GPU_RESOURCE


def named(gpus: Iterable[GpuInfo], sharing: Sharing) -> list[GpuInfo]:
    """`gpus` with `resource` set as `sharing` names them (the agent registers these names)."""
    return [gpu if gpu.resource == (name := resource_for(gpu, naming=sharing.resource_naming,
                                                           operating_mode=sharing.operating_mode))
            else gpu.model_copy(update={"resource": name}) for gpu in gpus]
