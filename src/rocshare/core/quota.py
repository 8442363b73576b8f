"""Namespace quota: does a pod's request fit what its namespace may still take. Pure.

Units are those of rocshare.core.holdings (MiB, percent of one GPU, GPU devices), and so is
the rule for what a pod costs: `request_cost` before bind equals `Holding.held` of the
record bind writes, so the quota a namespace has used (the sum of its pods' holds, which
share status reports too) and the check agree. The check returns ResourceQuotaNotFit with
what is over, or None.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocshare.api.models import ShareLimits, ShareUsage
from rocshare.core.fit import Reason
from rocshare.core.holdings import Held

QuotaCost = Held
"""The name the extender's callers use for a hold in quota units (the same type)."""


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    reason: Reason
    message: str


def check_quota(cost: Held, limits: ShareLimits, used: ShareUsage | Held) -> QuotaVerdict | None:
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
