"""Namespace quota: does a pod's request fit what its namespace may still take.

Units are consistent across limits, usage and requests: memory in MiB, cores in percent of
one GPU (250 = two and a half GPUs), GPUs as a device count. A container's cost per GPU:
* memory: its gpumem MiB; for a percentage or a whole GPU, that share of the GPU's
  registered memory, which is only known once a GPU is chosen -- so the caller passes the
  memory of the GPUs in question (``gpu_memory_mib``, the node's largest when filtering);
* cores: its gpucores; 100 for a whole GPU, and 100 for omitted gpucores under Exclusive
  (the slice holds every CU); 0 for omitted gpucores under Shared (it reserves none).
The pure check returns the reason ResourceQuotaNotFit with what is over, or None.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocshare.api.models import OmittedCores, ShareLimits, ShareUsage
from rocshare.core.fit import Reason
from rocshare.core.request import ContainerRequest, PodRequest


@dataclass(frozen=True, slots=True)
class QuotaCost:
    memory_mib: int = 0
    cores_pct: int = 0
    gpus: int = 0

    def __add__(self, other: QuotaCost) -> QuotaCost:
        return QuotaCost(self.memory_mib + other.memory_mib, self.cores_pct + other.cores_pct, self.gpus + other.gpus)


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    reason: Reason
    message: str


def container_cost(container: ContainerRequest, *, gpu_memory_mib: int, omitted: OmittedCores) -> QuotaCost:
    if not container.gpus:
        return QuotaCost()
    if container.memory_mib is not None:
        memory = container.memory_mib
    elif container.memory_pct is not None:
        memory = gpu_memory_mib * container.memory_pct // 100
    else:
        memory = gpu_memory_mib
    if container.cores_pct is not None:
        cores = container.cores_pct
    elif container.whole or omitted == OmittedCores.EXCLUSIVE:
        cores = 100
    else:
        cores = 0
    return QuotaCost(memory * container.gpus, cores * container.gpus, container.gpus)


def pod_cost(request: PodRequest, *, gpu_memory_mib: int, omitted: OmittedCores = OmittedCores.EXCLUSIVE) -> QuotaCost:
    total = QuotaCost()
    for container in request.containers:
        total = total + container_cost(container, gpu_memory_mib=gpu_memory_mib, omitted=omitted)
    return total


def check_quota(cost: QuotaCost, limits: ShareLimits, used: ShareUsage) -> QuotaVerdict | None:
    """None when the pod fits; else ResourceQuotaNotFit naming every term over its limit."""
    over = []
    for label, asked, held, limit in (
        ("memory MiB", cost.memory_mib, used.memory_mib, limits.memory_mib),
        ("cores %", cost.cores_pct, used.cores_pct, limits.cores_pct),
        ("GPUs", cost.gpus, used.gpus, limits.gpus),
    ):
        if limit is not None and held + asked > limit:
            over.append(f"{label}: {held} used + {asked} asked > {limit} limit")
    if not over:
        return None
    return QuotaVerdict(Reason.RESOURCE_QUOTA_NOT_FIT, "; ".join(over))
