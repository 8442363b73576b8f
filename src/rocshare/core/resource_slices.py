"""The node's GPUs as a resource.k8s.io/v1 ResourceSlice: the DRA driver's inventory. Pure.

One device per healthy GPU or partition, named from its stable id (a DNS label). The numbers
come from the same node model the extender works on (rocshare.core.inventory), so DRA and the
device plugin offer the same memory and compute:

* memory: the registered MiB (deviceMemoryScaling applied where the GPU can oversubscribe),
  published in bytes, consumed in whole MiB; a claim that does not ask takes all of it (an
  omitted amd.com/gpumem means 100 %, as under HAMi);
* compute: the CU count; requests round up to whole WGPs on RDNA (``GpuSpec.cu_align``) and
  never above the CUs whole WGPs cover (``cu_usable``); a claim that does not ask takes every
  CU when the pool's omittedCores is Exclusive and none when it is Shared;
* shares: splitCount, one per claim.

A shared device allows multiple allocations and gives every capacity a request policy. A
partition (partition mode, or a partition discovered in cu mode) is one whole, unshared
device: no multiple allocations, so no policies (the API allows them only on shared devices).
Unhealthy devices are left out: the scheduler must not place new claims on them.

Asked to (the agent's --dra-whole-twins, where the API server serves partitionable devices:
KEP-4815's shared counters, on by default from Kubernetes 1.36), `pool_slices` also offers each
shared GPU whole, as a second device, its *whole twin* (``<device>-whole``): unshared, listed before
the shared device, with memory and compute of 0 so that no capacity request fits it (a claim asking
capacity wants a share) and only a claim asking none takes it. The twin and the shared device
consume the one counter of the GPU's counter set, published in a second slice of the pool: a whole
twin allocated leaves nothing for a first share, and a shared device in use (kube-scheduler 1.37
charges its counters once, at its first share) leaves nothing for the twin. Partitions are whole
already and get no twin. A node whose twins would pass the API's limits
(8 counter sets, 64 devices in a slice with counters) publishes the one slice as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rocshare.api import dra
from rocshare.api.models import GpuInfo, Sharing
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.share_rules import omitted_cores_take_all

_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]+")


def device_name(gpu_id: str) -> str:
    """A DNS label from a GPU id: ``GPU-e3aa140f9a5f9e31-p0`` -> ``gpu-e3aa140f9a5f9e31-p0``."""
    return _NOT_IN_LABEL.sub("-", gpu_id.lower()).strip("-")[:63].rstrip("-")


def resource_slice(*, node_name: str, node_uid: str | None, gpus: Iterable[GpuInfo], sharing: Sharing,
                   generation: int) -> dict:
    """The node's ResourceSlice, owned by its Node (so it goes with it) when the uid is known."""
    metadata: dict = {"name": dra.slice_name(node_name)}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                        "controller": True}]
    return {
        "apiVersion": dra.RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": dra.DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": slice_devices(node_name, gpus, sharing),
        },
    }


def pool_slices(*, node_name: str, node_uid: str | None, gpus: Iterable[GpuInfo], sharing: Sharing,
                generation: int, counters: bool) -> list[dict]:
    """The node's pool: its devices slice (named as `resource_slice`'s), then, with `counters` (the API
    server serves shared counters) and a shared GPU to twin within the API's limits, its counters slice."""
    devices = slice_devices(node_name, gpus, sharing)
    shared = [device for device in devices if device.get("allowMultipleAllocations")]
    twinned = [twin for device in devices for twin in _with_twin(device)]
    if not counters or not shared or len(shared) > dra.SLICE_COUNTER_SETS_MAX \
            or len(twinned) > dra.SLICE_DEVICES_WITH_COUNTERS_MAX:
        return [resource_slice(node_name=node_name, node_uid=node_uid, gpus=gpus, sharing=sharing,
                               generation=generation)]
    main = _slice(dra.slice_name(node_name), node_name, node_uid, generation, count=2)
    main["spec"]["devices"] = twinned
    counter_slice = _slice(dra.counters_slice_name(node_name), node_name, node_uid, generation, count=2)
    counter_slice["spec"]["sharedCounters"] = [
        {"name": device["name"], "counters": {dra.COUNTER_GPU: {"value": "1"}}} for device in shared]
    return [main, counter_slice]


def _slice(name: str, node_name: str, node_uid: str | None, generation: int, *, count: int) -> dict:
    metadata: dict = {"name": name}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                        "controller": True}]
    return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceSlice", "metadata": metadata,
            "spec": {"driver": dra.DRIVER_NAME, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count}}}


def _with_twin(device: dict) -> list[dict]:
    """A shared device as its whole twin and itself, both consuming the GPU's counter; others alone."""
    if not device.get("allowMultipleAllocations"):
        return [device]
    consumes = [{"counterSet": device["name"], "counters": {dra.COUNTER_GPU: {"value": "1"}}}]
    twin = {"name": whole_device_name(device["name"]), "attributes": device["attributes"],
            "capacity": {dra.CAPACITY_MEMORY: {"value": "0"}, dra.CAPACITY_COMPUTE: {"value": "0"}},
            "consumesCounters": consumes}
    return [twin, {**device, "consumesCounters": consumes}]


def whole_device_name(name: str) -> str:
    """The whole twin of device `name` (a DNS label: the suffix replaces the name's tail if need be)."""
    return name[:63 - len(dra.WHOLE_DEVICE_SUFFIX)].rstrip("-") + dra.WHOLE_DEVICE_SUFFIX


def slice_devices(node_name: str, gpus: Iterable[GpuInfo], sharing: Sharing) -> list[dict]:
    infos = sorted(gpus, key=lambda info: info.index)
    node = NodeInventory.from_gpu_infos(node_name, infos, sharing)
    devices = [_device(info, spec, sharing) for info, spec in zip(infos, node.gpus) if spec.healthy]
    return devices[:dra.SLICE_DEVICES_MAX]


def _device(info: GpuInfo, spec: GpuSpec, sharing: Sharing) -> dict:
    device: dict = {"name": device_name(info.id), "attributes": _attributes(info)}
    if spec.partition:
        device["capacity"] = {dra.CAPACITY_MEMORY: {"value": _bytes(spec.memory_mib)},
                              dra.CAPACITY_COMPUTE: {"value": str(spec.cu_count)}}
        return device
    device["allowMultipleAllocations"] = True
    device["capacity"] = {
        dra.CAPACITY_MEMORY: {"value": _bytes(spec.memory_mib), "requestPolicy": _memory_policy(spec)},
        dra.CAPACITY_COMPUTE: {"value": str(spec.cu_count), "requestPolicy": _compute_policy(spec, sharing)},
        dra.CAPACITY_SHARES: {"value": str(spec.max_slices),
                              "requestPolicy": {"default": "1", "validValues": ["1"]}},
    }
    return device


def _memory_policy(spec: GpuSpec) -> dict:
    if spec.memory_mib == 0:
        # Unknown VRAM registers nothing (as under the device plugin): only a claim asking no memory fits.
        return {"default": "0", "validRange": {"min": "0", "max": "0"}}
    step = str(dra.MEMORY_STEP_BYTES)
    whole = _bytes(spec.memory_mib)
    return {"default": whole, "validRange": {"min": step, "max": whole, "step": step}}


def _compute_policy(spec: GpuSpec, sharing: Sharing) -> dict:
    align = spec.cu_align
    exclusive = omitted_cores_take_all(sharing.omitted_cores)
    # Shared: an omitted request reserves no CU, so 0 must be a valid amount; then the range starts
    # at 0 and every step (whole WGPs) above it is valid too.
    low = align if exclusive else 0
    default = spec.cu_usable if exclusive else 0
    return {"default": str(default),
            "validRange": {"min": str(low), "max": str(spec.cu_usable), "step": str(align)}}


def _attributes(info: GpuInfo) -> dict[str, dict]:
    attributes: dict[str, dict] = {
        dra.ATTRIBUTE_UUID: {"string": info.id[:dra.ATTRIBUTE_STRING_MAX_CHARS]},
        dra.ATTRIBUTE_GFX_TARGET: {"string": dra.gfx_target(info.gfx_target_version)},
        dra.ATTRIBUTE_GFX_TARGET_VERSION: {"int": info.gfx_target_version},
        dra.ATTRIBUTE_CU_PER_WGP: {"int": info.cu_per_wgp},
        dra.ATTRIBUTE_XGMI_PEERS: {"int": len(info.xgmi_peers)},
        dra.ATTRIBUTE_PCI_BUS_ID: {"string": info.pci_bdf},
    }
    if info.product:
        attributes[dra.ATTRIBUTE_PRODUCT] = {"string": info.product[:dra.ATTRIBUTE_STRING_MAX_CHARS]}
    if info.numa is not None and info.numa >= 0:
        attributes[dra.ATTRIBUTE_NUMA_NODE] = {"int": info.numa}
    if info.hive_id:
        attributes[dra.ATTRIBUTE_XGMI_HIVE] = {"string": info.hive_id}
    if info.partition is not None:
        attributes[dra.ATTRIBUTE_PARTITION] = {"string": info.partition.compute_mode}
        if info.partition.memory_mode:
            attributes[dra.ATTRIBUTE_MEMORY_PARTITION] = {"string": info.partition.memory_mode}
    return attributes


def _bytes(mib: int) -> str:
    return str(mib * dra.MEMORY_STEP_BYTES)


def gpus_by_device(gpus: Iterable[GpuInfo]) -> dict[str, GpuInfo]:
    """Which GPU each device name stands for, whole twins included (an allocation names either)."""
    named = {device_name(gpu.id): gpu for gpu in gpus}
    return named | {whole_device_name(name): gpu for name, gpu in named.items()}


def specs_by_device(node_name: str, gpus: Iterable[GpuInfo], sharing: Sharing) -> dict[str, GpuSpec]:
    """Each device name's GPU as the allocator sees it (registered memory, CUs, WGP size), healthy or
    not: prepare keeps the healthy, accounting reads every one an allocation may name. A shared GPU's
    whole twin names the same GPU (a claim allocated it holds the GPU whole: it has no shareID)."""
    specs = NodeInventory.from_gpu_infos(node_name, gpus, sharing).gpus
    named = {device_name(spec.gpu_id): spec for spec in specs}
    return named | {whole_device_name(name): spec for name, spec in named.items() if not spec.partition}
