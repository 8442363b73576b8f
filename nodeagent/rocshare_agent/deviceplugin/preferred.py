"""GetPreferredAllocation: which of the available device IDs the kubelet should take.

The IDs only count shares; the container's real GPUs come from the allocation record. The
preference keeps the kubelet's bookkeeping in step with the scheduler's ledger: IDs on the
GPUs committed for the pod in flight first, then GPUs joined to those by XGMI, then GPUs on
the same NUMA node, then the rest in KFD order. One ID per GPU before a second one on any GPU,
since a container asking for n devices was committed n distinct GPUs. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rocshare.api.models import GpuInfo
from rocshare_agent.deviceplugin.devices import gpu_of


def preferred_ids(available: Sequence[str], must_include: Sequence[str], size: int, *,
                  committed_gpu_ids: Sequence[str], gpus: Mapping[str, GpuInfo]) -> list[str]:
    chosen = list(dict.fromkeys(must_include))[:size]
    free = _free_by_gpu(available, chosen)
    used_gpus = list(dict.fromkeys(gpu_of(i) for i in chosen))
    while len(chosen) < size:  # first: one ID per GPU, each GPU ranked against those chosen so far
        candidates = [gpu_id for gpu_id, ids in free.items() if ids and gpu_id not in used_gpus]
        if not candidates:
            break
        best = _gpu_order(candidates, anchors=[*committed_gpu_ids, *used_gpus], committed=committed_gpu_ids, gpus=gpus)[0]
        chosen.append(free[best].pop(0))
        used_gpus.append(best)
    for gpu_id in used_gpus + _gpu_order(list(free), anchors=used_gpus, committed=committed_gpu_ids, gpus=gpus):
        while len(chosen) < size and free.get(gpu_id):  # then: more than one ID per GPU, only when needed
            chosen.append(free[gpu_id].pop(0))
    return chosen


def _free_by_gpu(available: Sequence[str], chosen: Sequence[str]) -> dict[str, list[str]]:
    taken = set(chosen)
    free: dict[str, list[str]] = {}
    for device_id in available:
        if device_id not in taken:
            free.setdefault(gpu_of(device_id), []).append(device_id)
    return free


def _gpu_order(gpu_ids: list[str], *, anchors: Sequence[str], committed: Sequence[str],
               gpus: Mapping[str, GpuInfo]) -> list[str]:
    rank_committed = {gpu_id: position for position, gpu_id in enumerate(committed)}
    anchor_gpus = [gpus[a] for a in anchors if a in gpus]

    def key(gpu_id: str) -> tuple[int, int]:
        if gpu_id in rank_committed:
            return (0, rank_committed[gpu_id])
        gpu = gpus.get(gpu_id)
        index = gpu.index if gpu else 1 << 30
        if gpu and any(_linked(gpu, anchor) for anchor in anchor_gpus):
            return (1, index)
        if gpu and any(gpu.numa is not None and gpu.numa == anchor.numa for anchor in anchor_gpus):
            return (2, index)
        return (3, index)

    return sorted(gpu_ids, key=key)


def _linked(a: GpuInfo, b: GpuInfo) -> bool:
    return b.pci_bdf in a.xgmi_peers or a.pci_bdf in b.xgmi_peers
