"""The names rocshare uses as a DRA driver (resource.k8s.io/v1), and its DeviceClass. Pure.

rocshare's driver is ``gpu.rocshare.io``: a name of its own, never AMD's ``gpu.amd.com``, so
both drivers can be installed in one cluster (never on one node: a pool serves either the
device plugin or DRA, ``spec.agent.interface``). Each node publishes one ResourceSlice in a
pool named after the node. Capacity and attribute names without a domain are the driver's
own (the API server qualifies them with the driver name); the PCI address and NUMA node use
Kubernetes' standard names so that cross-driver constraints (``matchAttribute``) work.

Capacities of a shared device, every one with a request policy (a capacity without one is
consumed whole by a claim that does not name it):

* ``memory``: bytes of registered VRAM (VRAM x deviceMemoryScaling where the GPU can
  oversubscribe), consumed in whole MiB, as ``amd.com/gpumem`` counts;
* ``compute``: compute units, consumed in whole WGPs on RDNA (2 CUs) and single CUs else;
* ``shares``: the pool's splitCount; each claim consumes exactly one, so the GPU holds at most
  splitCount claims, as it holds at most splitCount pods under the device plugin.
"""

from __future__ import annotations

DRIVER_NAME = "gpu.rocshare.io"
DRA_SCHEDULER_NAME = "rocshare-dra-scheduler"
"""The scheduler profile of DRA mode (manifests/base/scheduler/kube-scheduler-dra-config.yaml): admission
sends the pods whose amd.com/* limits it turned into claims there; kube-scheduler's DRA allocator picks
the devices, rocshare's extender scores the nodes."""
DEVICE_CLASS_NAME = "gpu.rocshare.io"
SHAPE_CLASS_SUFFIX = f".{DEVICE_CLASS_NAME}"
"""The classes of one GPU shape (rocshare.core.dra_claims.shape_class_name) are named <shape>.gpu.rocshare.io:
each selects the devices of gpu.rocshare.io of one CU count and memory, so a claim naming one carries no
CEL selector of its own (kube-scheduler evaluates one selector per device instead of two)."""
RESOURCE_API_VERSION = "resource.k8s.io/v1"

CAPACITY_MEMORY = "memory"
CAPACITY_COMPUTE = "compute"
CAPACITY_SHARES = "shares"
MEMORY_STEP_BYTES = 2**20
"""Memory is handed out in MiB: the unit of amd.com/gpumem and of HIP_DEVICE_MEMORY_LIMIT."""

ATTRIBUTE_UUID = "uuid"
ATTRIBUTE_PRODUCT = "productName"
ATTRIBUTE_GFX_TARGET = "gfxTarget"
ATTRIBUTE_GFX_TARGET_VERSION = "gfxTargetVersion"
ATTRIBUTE_CU_PER_WGP = "cuPerWGP"
ATTRIBUTE_XGMI_HIVE = "xgmiHive"
ATTRIBUTE_XGMI_PEERS = "xgmiPeerCount"
ATTRIBUTE_PARTITION = "computePartition"
ATTRIBUTE_MEMORY_PARTITION = "memoryPartition"
ATTRIBUTE_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTRIBUTE_NUMA_NODE = "resource.kubernetes.io/numaNode"
ATTRIBUTE_STRING_MAX_CHARS = 64
"""The API's limit on a string attribute's length."""

SLICE_DEVICES_MAX = 128
"""Devices one ResourceSlice may hold (ResourceSliceMaxDevices); a node has at most 64 DRM minors."""
SLICE_DEVICES_WITH_COUNTERS_MAX = 64
"""Devices one ResourceSlice may hold when some consume counters (ResourceSliceMaxDevicesWithAdvancedFeatures)."""
SLICE_COUNTER_SETS_MAX = 8
"""Counter sets one ResourceSlice may hold (ResourceSliceMaxCounterSets)."""

WHOLE_DEVICE_SUFFIX = "-whole"
"""A shared GPU's whole twin (partitionable devices, KEP-4815): ``gpu-1901ead3a2ecd4a6-whole``."""
COUNTER_GPU = "gpu"
"""The one counter of a shared GPU's counter set: 1. Its shared device and its whole twin each consume
it, so the GPU is either shared or whole; a shared device's later shares do not consume it again."""


def slice_name(node_name: str) -> str:
    """The node's one ResourceSlice (a DNS subdomain: node names are, and so is the suffix)."""
    return f"{node_name}-{DRIVER_NAME}"


def counters_slice_name(node_name: str) -> str:
    """The node's second slice, holding its GPUs' counter sets, when it publishes whole twins."""
    return f"{slice_name(node_name)}-counters"


def gfx_target(gfx_target_version: int) -> str:
    """gfx_target_version as the gfx name compilers use: 90402 -> gfx942, 90010 -> gfx90a, 110000 -> gfx1100."""
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def is_rocshare_class(name: object) -> bool:
    """A DeviceClass name that asks rocshare's devices: gpu.rocshare.io or a class of one GPU shape
    (any name under it counts, as admission and quota must never miss one)."""
    return isinstance(name, str) and (name == DEVICE_CLASS_NAME or name.endswith(SHAPE_CLASS_SUFFIX))


def device_class() -> dict:
    """The DeviceClass claims name to get a rocshare GPU (share or whole device)."""
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    }
