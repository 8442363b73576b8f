"""Status conditions per Kubernetes API conventions. Pure.

`lastTransitionTime` moves only when a condition's status changes; a new reason or
message keeps the old time, so `kubectl describe` shows how long a state has held.
Every condition carries the `observedGeneration` it was computed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ConditionState:
    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str = ""


def merge_conditions(previous: Iterable[Mapping] | None, states: Iterable[ConditionState], *,
                     generation: int | None, now: str) -> list[dict]:
    """The conditions list to write: `states`, with transition times kept from `previous` where due."""
    earlier = {condition.get("type"): condition for condition in previous or ()}
    merged = []
    for state in states:
        before = earlier.get(state.type)
        keep_time = before is not None and before.get("status") == state.status and before.get("lastTransitionTime")
        condition = {"type": state.type, "status": state.status, "reason": state.reason, "message": state.message,
                     "lastTransitionTime": before["lastTransitionTime"] if keep_time else now}
        if generation is not None:
            condition["observedGeneration"] = generation
        merged.append(condition)
    return merged

