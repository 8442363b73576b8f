"""Namespace quota for the extender, in the units of DESIGN.md section 3: MiB, percent of
one GPU for cores, GPU devices.

What a namespace holds is the sum of its pods' holds (rocshare.core.holdings, kept by
`Accounts` from the allocation records, the same way at bind time and after a restart), and
what a pod will hold is `request_cost` of the same module: status, this check and bind agree.
A namespace holding a pod that cannot be accounted for takes no new pod while it has a limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocshare.api.models import ShareLimits
from rocshare.core.holdings import Held, request_cost
from rocshare.core.inventory import NodeInventory
from rocshare.core.quota import limited, over_quota_refusal, unknown_use_refusal
from rocshare.core.request import PodRequest


def quota_verdict(request: PodRequest, node: NodeInventory, limits: ShareLimits, used: Held,
                  unaccountable: Sequence[str] = ()) -> str | None:
    """None when the pod fits its namespace's limits on this node's GPUs; else what is over."""
    if not limited(limits):
        return None
    unknown = unknown_use_refusal(request.namespace, unaccountable)
    if unknown is not None:
        return unknown
    largest_mib = max((gpu.memory_mib for gpu in node.gpus), default=0)
    partitions = any(gpu.partition for gpu in node.gpus)
    cost = request_cost(request, gpu_memory_mib=largest_mib, omitted=node.omitted_cores, whole_devices=partitions)
    return over_quota_refusal(request.namespace, cost, limits, used)
