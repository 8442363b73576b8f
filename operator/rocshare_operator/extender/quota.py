"""Namespace quota for the extender, in the units of DESIGN.md section 3: MiB, percent of
one GPU for cores, GPU devices.

What a namespace holds is the sum of its pods' holds (rocshare.core.holdings, kept by
`Accounts` from the allocation records, the same way at bind time and after a restart), and
what a pod will hold is `request_cost` of the same module: status, this check and bind agree.
A namespace holding a pod that cannot be accounted for takes no new pod while it has a limit.
"""

from __future__ import annotations

from rocshare.api.models import ShareLimits
from rocshare.core.holdings import Held, request_cost
from rocshare.core.inventory import NodeInventory
from rocshare.core.quota import check_quota
from rocshare.core.request import PodRequest


def limited(limits: ShareLimits) -> bool:
    return limits.memory_mib is not None or limits.cores_pct is not None or limits.gpus is not None


def quota_verdict(request: PodRequest, node: NodeInventory, limits: ShareLimits, used: Held,
                  unaccountable: list[str] = ()) -> str | None:
    """None when the pod fits its namespace's limits on this node's GPUs; else what is over."""
    if not limited(limits):
        return None
    if unaccountable:
        return (f"the namespace holds {len(unaccountable)} pod(s) whose use cannot be read, so its quota"
                f" use is unknown: {'; '.join(sorted(unaccountable)[:3])}")
    largest_mib = max((gpu.memory_mib for gpu in node.gpus), default=0)
    partitions = any(gpu.partition for gpu in node.gpus)
    cost = request_cost(request, gpu_memory_mib=largest_mib, omitted=node.omitted_cores, whole_devices=partitions)
    verdict = check_quota(cost, limits, used)
    return None if verdict is None else verdict.message
