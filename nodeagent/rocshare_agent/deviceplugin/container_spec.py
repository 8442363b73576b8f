"""What one container receives for its committed GPUs: environment, device nodes, mounts.

A pure function of the allocation record's container entry and the node's inventory
(DESIGN.md section 4). Invariants:

* ``/dev/kfd`` once, then per GPU ``/dev/dri/card<N>`` (when the GPU has a card node) and
  ``/dev/dri/renderD<M>``, read-write, in the container's GPU order.
* ``<i>`` in ``HSA_CU_MASK`` and ``HIP_DEVICE_MEMORY_LIMIT_<i>`` is the GPU's position in the
  record's device list, which is also ``HIP_VISIBLE_DEVICES`` order.
* A whole GPU gets no memory limit; a container holding only whole GPUs gets no hook, no limit
  and no ``HIP_OVERSUBSCRIBE``. Any slice brings the hook: ``LD_AUDIT`` plus the library
  mounted read-only -- unless the node has no hook and its pool runs slices without one
  (``memory_hook=False``): then no hook and no ``HIP_DEVICE_MEMORY_LIMIT_<i>`` either, since
  nothing would enforce it (the caller says so in an event; see hook.py).
* A slice given the hook, when the caller made its account folder (`account`), gets it mounted:
  the usage folder read-write and the slice folder read-only, at the fixed paths of
  docs/container-account.md, with ROCSHARE_ACCOUNT_DIR and ROCSHARE_SLICE_DIR naming them.
* On an oversubscribed pool (deviceMemoryScaling > 1), a slice whose GPUs can all oversubscribe
  (XNACK-capable: CDNA and the other gfx9 parts) gets ``HIP_OVERSUBSCRIBE=true`` and
  ``HSA_XNACK=1``, since hipMalloc then allocates from managed memory, which needs XNACK. An RDNA
  GPU is never scaled (rocshare.api.gfx), so its slices get neither.
* ``ROCR_VISIBLE_DEVICES`` names each GPU by its ROCr UUID ``GPU-<16 hex>``. A device without
  one (an APU with unique_id 0, a compute partition) is named by its index among the
  container's GPUs in KFD order, because ROCr inside the container enumerates only the render
  nodes mounted there, in KFD order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from rocshare.api.allocation import ContainerAllocation, DeviceSlice
from rocshare.api.container_account import ACCOUNT_CONTAINER_DIR, ACCOUNT_DIR_ENV, SLICE_CONTAINER_DIR, SLICE_DIR_ENV
from rocshare.api.container_env import (
    HIP_OVERSUBSCRIBE,
    HIP_VISIBLE_DEVICES,
    HOOK_CONTAINER_DIR,
    HOOK_CONTAINER_PATH,
    HOOK_LIBRARY,
    HSA_CU_MASK,
    HSA_XNACK,
    LD_AUDIT,
    ROCR_VISIBLE_DEVICES,
    memory_limit_name,
)
from rocshare.api.gfx import xnack_capable
from rocshare.api.models import GpuInfo
from rocshare.core.cumask import render_hsa_cu_mask

__all__ = ["AccountFolders", "HOOK_CONTAINER_DIR", "HOOK_CONTAINER_PATH", "HOOK_LIBRARY", "ContainerSpec", "DeviceNode", "Mount",
           "SpecError", "render_container"]
ROCR_UUID = re.compile(r"^GPU-[0-9a-fA-F]{16}$")


class SpecError(ValueError):
    """The record names something this node cannot provide (unknown GPU, no render node)."""


@dataclass(frozen=True)
class DeviceNode:
    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class AccountFolders:
    """The host folders of a container's account (accounts.py made them)."""

    usage_host_dir: str
    slice_host_dir: str


@dataclass(frozen=True)
class ContainerSpec:
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[DeviceNode] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)


def render_container(container: ContainerAllocation, gpus_by_id: Mapping[str, GpuInfo], *, oversubscribed: bool,
                     hook_host_dir: str, memory_hook: bool = True, dev_root: str = "/dev",
                     account: AccountFolders | None = None) -> ContainerSpec:
    """The spec for `container`; raises SpecError when a committed GPU is not on this node."""
    gpus = [_gpu_for(device, gpus_by_id, container.name) for device in container.devices]
    has_slice = any(not device.whole for device in container.devices)
    envs = {
        ROCR_VISIBLE_DEVICES: ",".join(_rocr_names(gpus)),
        HIP_VISIBLE_DEVICES: ",".join(str(i) for i in range(len(gpus))),
    }
    cu_mask = render_hsa_cu_mask(container.devices)
    if cu_mask:
        envs[HSA_CU_MASK] = cu_mask
    mounts: list[Mount] = []
    if has_slice:
        if memory_hook:
            envs.update(_memory_limits(container.devices))
            envs[LD_AUDIT] = HOOK_CONTAINER_PATH
            mounts.append(Mount(str(PurePosixPath(hook_host_dir) / HOOK_LIBRARY), HOOK_CONTAINER_PATH))
            if account is not None:
                envs[ACCOUNT_DIR_ENV] = ACCOUNT_CONTAINER_DIR
                envs[SLICE_DIR_ENV] = SLICE_CONTAINER_DIR
                mounts.append(Mount(account.usage_host_dir, ACCOUNT_CONTAINER_DIR, read_only=False))
                mounts.append(Mount(account.slice_host_dir, SLICE_CONTAINER_DIR, read_only=True))
        if oversubscribed and all(xnack_capable(gpu.gfx_target_version) for gpu in gpus):
            envs[HIP_OVERSUBSCRIBE] = "true"
            envs[HSA_XNACK] = "1"
    return ContainerSpec(envs=envs, devices=_device_nodes(gpus, dev_root), mounts=mounts)


def _gpu_for(device: DeviceSlice, gpus_by_id: Mapping[str, GpuInfo], container_name: str) -> GpuInfo:
    gpu = gpus_by_id.get(device.gpu_id)
    if gpu is None:
        raise SpecError(f"container {container_name}: committed GPU {device.gpu_id} is not on this node")
    if gpu.render_minor is None:
        raise SpecError(f"container {container_name}: GPU {device.gpu_id} has no render node")
    return gpu


def _memory_limits(devices: list[DeviceSlice]) -> dict[str, str]:
    return {memory_limit_name(i): f"{device.memory_mib}m"
            for i, device in enumerate(devices) if not device.whole}


def _rocr_names(gpus: list[GpuInfo]) -> list[str]:
    kfd_position = {gpu.id: position for position, gpu in enumerate(sorted(gpus, key=lambda g: g.index))}
    return [gpu.id if ROCR_UUID.match(gpu.id) else str(kfd_position[gpu.id]) for gpu in gpus]


def _device_nodes(gpus: list[GpuInfo], dev_root: str) -> list[DeviceNode]:
    root = PurePosixPath(dev_root)
    nodes = [DeviceNode(str(root / "kfd"), "/dev/kfd")]
    for gpu in gpus:
        if gpu.card is not None:
            nodes.append(DeviceNode(str(root / "dri" / f"card{gpu.card}"), f"/dev/dri/card{gpu.card}"))
        nodes.append(DeviceNode(str(root / "dri" / f"renderD{gpu.render_minor}"), f"/dev/dri/renderD{gpu.render_minor}"))
    return nodes
