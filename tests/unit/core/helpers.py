"""Small builders for core tests: GPUs, nodes and pod dicts."""

from __future__ import annotations

from rocshare.api.models import OmittedCores
from rocshare.core.ids import GpuId, NodeName
from rocshare.core.inventory import GpuSpec, NodeInventory


def gpu(i: int, *, memory_mib: int = 65536, cu_count: int = 104, product: str = "AMD Instinct MI210",
        gfx: int = 90010, cu_per_wgp: int = 1, numa: int | None = 0, peers: tuple[int, ...] = (),
        split_count: int = 10, healthy: bool = True, partition: bool = False, node: str = "n1") -> GpuSpec:
    return GpuSpec(
        gpu_id=GpuId(f"GPU-{node}-{i:04d}"), index=i, memory_mib=memory_mib, cu_count=cu_count, product=product,
        gfx_target_version=gfx, cu_per_wgp=cu_per_wgp, numa=numa,
        xgmi_peers=tuple(sorted({GpuId(f"GPU-{node}-{p:04d}") for p in peers})), split_count=split_count,
        healthy=healthy, partition=partition,
    )


def node(*gpus: GpuSpec, name: str = "n1", omitted: OmittedCores = OmittedCores.EXCLUSIVE) -> NodeInventory:
    return NodeInventory(NodeName(name), tuple(gpus), omitted_cores=omitted)


def pod(*containers: dict, init: tuple[dict, ...] = (), annotations: dict | None = None, name: str = "p") -> dict:
    def container(i: int, limits: dict) -> dict:
        return {"name": f"c{i}", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}

    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}},
        "spec": {
            "initContainers": [container(100 + i, c) for i, c in enumerate(init)],
            "containers": [container(i, c) for i, c in enumerate(containers)],
        },
    }
