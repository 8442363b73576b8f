"""Namespace quota: does a pod's request fit what its namespace may still take. Pure.

Units are those of rocshare.core.holdings (MiB, percent of one GPU, GPU devices), and so is
the rule for what a pod costs: `request_cost` before bind equals `Holding.held` of the
record bind writes, so the quota a namespace has used (the sum of its pods' holds, which
share status reports too) and the check agree. The check returns ResourceQuotaNotFit with
what is over, or None.

The extender (pods) and the claim webhook (DRA claims) apply the same rules, written here
once: whether a namespace is `limited` at all, that one whose use cannot be read takes
nothing more (`unknown_use_refusal`), and what is over (`over_quota_refusal`), in one text.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def limited(limits: ShareLimits) -> bool:
    """Whether the namespace's AmdGpuShares limit anything (no limit: nothing is checked or refused)."""
    return limits.memory_mib is not None or limits.cores_pct is not None or limits.gpus is not None


UNKNOWN_USE_SHOWN = 3
"""How many of the holders whose use cannot be read a refusal names."""


def unknown_use_refusal(namespace: str, unaccountable: Sequence[str]) -> str | None:
    """Why a limited namespace takes nothing more while it holds pods or claims whose use cannot be
    read (`unaccountable`: "key (why)" each); None when it holds none."""
    if not unaccountable:
        return None
    return (f"namespace {namespace} holds {len(unaccountable)} pod(s) or claim(s) whose use cannot be read, "
            f"so its quota use is unknown: {'; '.join(sorted(unaccountable)[:UNKNOWN_USE_SHOWN])}")


def over_quota_refusal(namespace: str, cost: Held, limits: ShareLimits, used: ShareUsage | Held) -> str | None:
    """What `cost` on top of `used` takes the namespace over (check_quota's terms), or None."""
    verdict = check_quota(cost, limits, used)
    return None if verdict is None else f"namespace {namespace}: {verdict.message}"
