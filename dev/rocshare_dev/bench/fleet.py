"""A benchmark fleet: many 8-GPU nodes built from the real sysfs captures, and pods on them.

Inventories come from the agent's own discovery of two captures in ../shared/fixtures/sysfs:
* ``mi210``: mi210-8gpu-xgmi as discovered (8 x MI210, 104 CUs, two XGMI hives of four);
* ``mi300x``: mi300x-8gpu-cpx folded back to its 8 physical GPUs (one per partition parent,
  CUs summed: 8 x 38 = 304, the MI300X's count, and 8 XCCs; XGMI between all of them), since the
  capture is in CPX mode and this fleet is 8 GPUs per node.
Neither capture has a VRAM file, so VRAM is **synthetic**: 64 GiB (MI210) and 192 GiB
(MI300X), the products' sizes. GPU ids are made unique per node (the ledger keys GPUs by id
cluster-wide, as real unique ids are); PCI addresses stay as captured.

Pods are drawn from ``POD_MIX`` (slices by MiB and percent, whole GPUs, a 4-GPU pod) and
placed with the core allocator, so every record is one the extender could have written.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import API_VERSION, AmdGpuNodeStatus, GpuInfo
from rocshare.api.node_settings import (
    HAMI_OPERATING_MODE_ANNOTATION, POOL_LABEL, POOL_SETTINGS_ANNOTATION, NodeSettings, encode_settings)
from rocshare.core.holdings import placement_request
from rocshare.core.request import PodRequest

FIXTURES = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "sysfs"
SYNTHETIC_VRAM_MIB = {"mi210": 64 * 1024, "mi300x": 192 * 1024}
KINDS = ("mi210", "mi300x")
POOL = "bench"
NAMESPACE = "bench"
FLEET_LABEL = "rocshare.io/bench-fleet"

# (weight, resources per container): the mix fills nodes and the timed pods are drawn from it.
# Slices carry amd.com/gpu: 1 as the admission webhook adds it (the kubelet allocates by it).
POD_MIX: tuple[tuple[int, dict[str, str]], ...] = (
    (30, {"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "25"}),
    (20, {"amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "10"}),
    (15, {"amd.com/gpu": "1", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "50"}),
    (10, {"amd.com/gpu": "1", "amd.com/gpumem": "4096"}),
    (15, {"amd.com/gpu": "1"}),
    (7, {"amd.com/gpu": "2", "amd.com/gpumem": "20480", "amd.com/gpucores": "30"}),
    (3, {"amd.com/gpu": "4"}),
)


# ---- inventories -----------------------------------------------------------------------------


@cache
def captured_gpus(kind: str) -> tuple[GpuInfo, ...]:
    """The 8 GPUs of one capture, with synthetic VRAM (see the module docstring)."""
    from rocshare_agent.discovery import discover

    folder = {"mi210": "mi210-8gpu-xgmi", "mi300x": "mi300x-8gpu-cpx"}[kind]
    gpus = discover(FIXTURES / folder).gpus
    if kind == "mi300x":
        gpus = _fold_partitions(gpus)
    return tuple(gpu.model_copy(update={"vram_mib": SYNTHETIC_VRAM_MIB[kind]}) for gpu in gpus)


def _fold_partitions(partitions: list[GpuInfo]) -> list[GpuInfo]:
    by_parent: dict[str, list[GpuInfo]] = {}
    for part in partitions:
        by_parent.setdefault(part.partition.parent_bdf if part.partition else part.pci_bdf, []).append(part)
    parents = sorted(by_parent)
    folded = []
    for index, bdf in enumerate(parents):
        first = by_parent[bdf][0]
        folded.append(first.model_copy(update={
            "id": first.id.removesuffix("-p0"), "index": index, "pci_bdf": bdf, "partition": None,
            "cu_count": 38 * 8, "xgmi_peers": [peer for peer in parents if peer != bdf],
            # SPX: the 8 XCCs of the partitions in one device (array_count stays one XCC's)
            "cu_topology": first.cu_topology.model_copy(update={"num_xcc": 8}) if first.cu_topology else None}))
    return folded


def node_gpus(node: str, kind: str) -> list[GpuInfo]:
    return [gpu.model_copy(update={"id": _unique_id(node, gpu.id)}) for gpu in captured_gpus(kind)]


def _unique_id(node: str, gpu_id: str) -> str:
    return "GPU-" + hashlib.blake2b(f"{node}/{gpu_id}".encode(), digest_size=8).hexdigest()


def node_kind(index: int) -> str:
    return KINDS[index % len(KINDS)]


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


# ---- Kubernetes objects ------------------------------------------------------------------------


def node_object(name: str, kind: str) -> dict[str, Any]:
    """A Node as a kubelet, rocshare's agent and operator leave it (labels, pool marks, capacity,
    Ready): realistic in size, and already marked as the bench pool wants, so the operator's
    pool loop has nothing to write."""
    gpus = captured_gpus(kind)
    resources = {"cpu": "128", "memory": "1056462800Ki", "pods": "110", "ephemeral-storage": "1844019980Ki",
                 "hugepages-1Gi": "0", "hugepages-2Mi": "0", "amd.com/gpu": str(len(gpus))}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": f"{kind}-8x", POOL_LABEL: POOL, FLEET_LABEL: "yes",
              "amd.com/gpu.product-name": gpus[0].product.replace(" ", "_"), "amd.com/gpu.family": "AI",
              "amd.com/gpu.cu-count": str(gpus[0].cu_count), "amd.com/gpu.device-id": gpus[0].device_id[2:]}
    conditions = [{"type": kind_, "status": "False", "reason": f"KubeletHas{kind_}"} for kind_ in
                  ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady"})
    annotations = {POOL_SETTINGS_ANNOTATION: encode_settings(NodeSettings(pool=POOL)),
                   HAMI_OPERATING_MODE_ANNOTATION: "cu"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {"capacity": resources, "allocatable": resources, "conditions": conditions,
                       "nodeInfo": {"kubeletVersion": "v1.35.4", "osImage": "Ubuntu 24.04 LTS",
                                    "containerRuntimeVersion": "containerd://2.1.0",
                                    "kernelVersion": "6.8.0-60-generic", "architecture": "amd64",
                                    "operatingSystem": "linux"}}}


def gpu_node_status(name: str, kind: str) -> AmdGpuNodeStatus:
    return AmdGpuNodeStatus(gpus=node_gpus(name, kind), agent_version="bench")


def gpu_node_object(name: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": name}, "spec": {},
            "status": gpu_node_status(name, kind).to_json_dict()}


def pool_object(scheduling: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {FLEET_LABEL: "yes"}}
    if scheduling:
        spec["scheduling"] = dict(scheduling)
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL}, "spec": spec}


def pod_object(name: str, resources: dict[str, str], *, node: str = "",
               record: AllocationRecord | None = None) -> dict[str, Any]:
    """A GPU pod of rocshare's scheduler; bound with its record when ``record`` is given."""
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"}}
    spec: dict[str, Any] = {
        "schedulerName": "rocshare-scheduler",
        "containers": [{"name": "main", "image": "rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.6.0",
                        "command": ["python3", "train.py"],
                        "resources": {"limits": dict(resources), "requests": {"cpu": "2", "memory": "8Gi"}}}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
    }
    if node:
        spec["nodeName"] = node
    if record is not None:
        metadata["annotations"] = {ALLOCATION_ANNOTATION: encode_record(record)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# ---- pods ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixedPod:
    name: str
    resources: dict[str, str]
    request: PodRequest


def draw_pods(rng: random.Random, prefix: str = "pod") -> Iterator[MixedPod]:
    weights = [weight for weight, _ in POD_MIX]
    serial = 0
    while True:
        (_, resources), = rng.choices(POD_MIX, weights)
        name = f"{prefix}-{serial:06d}"
        yield MixedPod(name, resources, placement_request(pod_object(name, resources)))  # with its CPU, as the extender reads it
        serial += 1


def held_share(loads, specs) -> float:
    """Mean over GPUs of the larger held fraction (memory or CUs): the fleet's occupancy."""
    total = 0.0
    for (memory_mib, _slices, cu_held, whole), spec in zip(loads, specs):
        total += 1.0 if whole else max(memory_mib / spec.memory_mib, cu_held / spec.cu_count)
    return total / len(specs)
