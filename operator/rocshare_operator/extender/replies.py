"""The extender's replies to kube-scheduler, on the wire: typed rejections rendered once as
the extender API's `"<n>/<total> <Reason>"` strings, filter's ExtenderFilterResult and
prioritize's HostPriorityList (DESIGN.md section 6). No decision is made here; decisions.py
makes them and hands these back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from rocshare.core.fit import FitFailure
from rocshare.core.policies import MAX_EXTENDER_SCORE


@dataclass(frozen=True)
class Rejection:
    reasons: tuple[tuple[str, int], ...]
    total: int
    detail: str = ""
    rendered: str = field(init=False, repr=False, compare=False)
    """The extender API's text, rendered once: memoised rejections go into many replies."""

    def __post_init__(self) -> None:
        summary = ", ".join(f"{count}/{self.total} {reason}" for reason, count in self.reasons)
        object.__setattr__(self, "rendered", f"{summary} ({self.detail})" if self.detail else summary)

    @classmethod
    def of_fit(cls, failure: FitFailure) -> Rejection:
        return cls(tuple((reason.value, count) for reason, count in failure.reasons), failure.total)

    @classmethod
    def whole_node(cls, reason: str, total: int, detail: str = "") -> Rejection:
        return cls(((reason, total),), total, detail)

    def text(self) -> str:
        return self.rendered


@dataclass(frozen=True)
class FilterResult:
    feasible: list[str]
    failed: dict[str, Rejection]

    def to_json(self) -> dict:
        return {"NodeNames": self.feasible, "FailedNodes": {name: r.rendered for name, r in self.failed.items()},
                "FailedAndUnresolvableNodes": {}, "Error": ""}

    def reason_counts(self) -> Counter[str]:
        """Nodes rejected per reason word (for metrics: one increment per reason, not per node)."""
        counts: Counter[str] = Counter()
        for rejection, nodes in Counter(self.failed.values()).items():  # failures alike are few
            for reason, _gpus in rejection.reasons:
                counts[reason] += nodes
        return counts


@dataclass(frozen=True)
class Priorities:
    """prioritize's answer: each listed node's 0-10 score, in kube-scheduler's order.

    Kept as two lists and written as JSON text directly (`to_json`): no object per node, so a
    decision allocates next to nothing the garbage collector counts, and rarely sets off a
    collection (a reply dict per node did so in nearly every decision at 1,000 nodes: ~800 net
    allocations against the young generation's threshold of 700)."""
    names: list[str]
    levels: list[int]

    def scores(self) -> dict[str, int]:
        return dict(zip(self.names, self.levels))

    def lowered(self, penalties: Mapping[str, int]) -> Priorities:
        """Scores less each listed node's penalty (never below 0)."""
        return Priorities(self.names, [max(0, level - penalties.get(name, 0))
                                       for name, level in zip(self.names, self.levels)])

    def to_json(self) -> orjson.Fragment:
        """The HostPriorityList, [{"Host": name, "Score": n}, ...], as JSON text."""
        starts = _host_entries(self.names)
        entries = map(bytes.__add__, map(starts.__getitem__, self.names), map(_SCORE_ENDINGS.__getitem__, self.levels))
        return orjson.Fragment(b"[" + b",".join(entries) + b"]")


_SCORE_ENDINGS = [b',"Score":%d}' % level for level in range(MAX_EXTENDER_SCORE + 1)]
_HOST_ENTRIES: dict[str, bytes] = {}
"""Node name -> b'{"Host":"<name>"' (the name JSON-quoted): kube-scheduler names the same nodes."""
_HOST_ENTRIES_MAX = 100_000


def _host_entries(names: list[str]) -> dict[str, bytes]:
    """`_HOST_ENTRIES`, holding every one of `names`."""
    if not _HOST_ENTRIES.keys() >= set(names):
        if len(_HOST_ENTRIES) + len(names) > _HOST_ENTRIES_MAX:
            _HOST_ENTRIES.clear()
        for name in names:
            if name not in _HOST_ENTRIES:
                _HOST_ENTRIES[name] = b'{"Host":' + orjson.dumps(name)
    return _HOST_ENTRIES
