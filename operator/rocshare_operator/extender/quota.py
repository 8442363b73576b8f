"""Namespace quota for the extender, in the units of DESIGN.md section 3: MiB, percent of
one GPU for cores (a whole GPU or an all-cores slice counts 100), GPU devices.

What a namespace holds is computed from the allocation records in the ledger, the same
way at bind time and after a restart, so accounting cannot drift between the two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rocshare.api.allocation import AllocationRecord
from rocshare.api.models import ShareLimits, ShareUsage
from rocshare.core.inventory import NodeInventory
from rocshare.core.quota import QuotaCost, check_quota, pod_cost
from rocshare.core.request import PodRequest


def record_cost(record: AllocationRecord, cu_totals: Mapping[str, int]) -> QuotaCost:
    """What a committed record holds. A GPU whose CU total is unknown counts its slice as 100 %."""
    cost = QuotaCost()
    for container in record.containers:
        for device in container.devices:
            total = cu_totals.get(device.gpu_id, 0)
            if device.whole or device.reserves_all_cores or not device.cu_ranges or not total:
                cores_pct = 100 if (device.whole or device.reserves_all_cores or not total) else 0
            else:
                cores_pct = math.ceil(device.cu_count * 100 / total)
            cost = cost + QuotaCost(device.memory_mib, cores_pct, 1)
    return cost


def cu_totals_of(node: NodeInventory | None) -> dict[str, int]:
    return {gpu.gpu_id: gpu.cu_count for gpu in node.gpus} if node else {}


def quota_verdict(request: PodRequest, node: NodeInventory, limits: ShareLimits, used: QuotaCost) -> str | None:
    """None when the pod fits its namespace's limits on this node's GPUs; else what is over."""
    if limits.memory_mib is None and limits.cores_pct is None and limits.gpus is None:
        return None
    largest_mib = max((gpu.memory_mib for gpu in node.gpus), default=0)
    cost = pod_cost(request, gpu_memory_mib=largest_mib, omitted=node.omitted_cores)
    usage = ShareUsage(memory_mib=used.memory_mib, cores_pct=used.cores_pct, gpus=used.gpus)
    verdict = check_quota(cost, limits, usage)
    return None if verdict is None else verdict.message
