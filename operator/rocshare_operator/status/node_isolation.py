"""An AmdGpuNode's ``status.isolation``: per GPU holding pods, which pods' CUs are on each XCD (a
GPU with several) or shader engine. Pure.

The holds are the core's (rocshare.core.holdings, what pool status sums too); where each held
mask bit lands is the kernel's rule (rocshare.core.cu_topology, via CuTopology.tenants_by_unit,
which the extender's rocshare_gpu_unit_* metrics read as well). A pod whose record cannot be
read is left out: nothing says which CUs it holds (pool status reports it as Degraded).
"""

from __future__ import annotations

from collections.abc import Sequence

from rocshare.api.models import GpuIsolation, IsolationUnit, UnitTenant
from rocshare.core.inventory import gpu_topology
from rocshare_operator.feed.cluster_facts import GpuFacts
from rocshare_operator.status.usage import PodSlices


def node_isolation(gpus: Sequence[GpuFacts], pods: Sequence[PodSlices]) -> list[dict]:
    """The status.isolation list to write (camelCase JSON, as GpuIsolation), GPUs in the node's order."""
    masks = _masks_by_gpu(pods)
    found = []
    for gpu in gpus:
        topology = gpu_topology(gpu)
        if topology is None or gpu.id not in masks:
            continue
        unit, on_units = topology.tenants_by_unit(masks[gpu.id])
        unit_masks = topology.isolation_units()[1]
        units = [IsolationUnit(index=index, cu_count=unit_masks[index].bit_count(),
                               tenants=[UnitTenant(pod=pod, cus_held=cus) for pod, cus in sorted(on_unit.items())])
                 for index, on_unit in enumerate(on_units)]
        found.append(GpuIsolation(gpu_id=gpu.id, unit=unit, units=units).to_json_dict())
    return found


def _masks_by_gpu(pods: Sequence[PodSlices]) -> dict[str, dict[str, int]]:
    """GPU id -> pod (namespace/name) -> the CU mask bits it holds there, all containers together."""
    masks: dict[str, dict[str, int]] = {}
    for pod in pods:
        if pod.error:
            continue
        for gpu in pod.holding.gpus:
            held = masks.setdefault(gpu.gpu_id, {})
            key = f"{pod.namespace}/{pod.name}"
            held[key] = held.get(key, 0) | gpu.cu_mask
    return masks
