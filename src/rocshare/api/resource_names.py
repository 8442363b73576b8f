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

from rocshare.api.models import GpuInfo, OperatingMode, Partition, ResourceNaming, Sharing

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
    if naming is ResourceNaming.MIXED and operating_mode is OperatingMode.PARTITION:
        return partition_resource(gpu.partition) or GPU_RESOURCE
    return GPU_RESOURCE


def partition_resource(partition: Partition | None) -> str | None:
    """The partition kind mixed naming offers a partition of these modes under (``amd.com/cpx_nps4``;
    ``amd.com/cpx`` when its memory mode is unknown); None for no partition or modes it has no name for.
    DRA pools match a partition kind against the same modes (rocshare.core.dra_claims.partition_selector)."""
    if partition is None:
        return None
    compute = partition.compute_mode.lower()
    memory = (partition.memory_mode or "").lower()
    name = f"amd.com/{compute}_{memory}" if memory else f"amd.com/{compute}"
    return name if is_partition_resource(name) else None


def partition_modes(resource: str) -> tuple[str, str | None]:
    """The compute and memory modes (lower case; memory None when the name has none) a partition kind
    names: the inverse of partition_resource. Raises ValueError for a name that is no partition kind."""
    found = PARTITION_RESOURCE.match(resource)
    if found is None:
        raise ValueError(f"{resource} is not a partition kind")
    return found.group(1), found.group(2)


def named(gpus: Iterable[GpuInfo], sharing: Sharing) -> list[GpuInfo]:
    """`gpus` with `resource` set as `sharing` names them (the agent registers these names)."""
    return [gpu if gpu.resource == (name := resource_for(gpu, naming=sharing.resource_naming,
                                                           operating_mode=sharing.operating_mode))
            else gpu.model_copy(update={"resource": name}) for gpu in gpus]
