"""The plan cache: answers of the core planner per (pod shape, policy) and node, and the one
rule that says when an answer may be reused.

An answer for a node is a pure function of (the node's inventory, its ledger usage, the key),
so it is valid exactly while neither changed since it was computed. Each key's answers are kept
in two tables (`fits`: node -> score, `misfits`: node -> why not) valid as of a position in the
ledger's journal: `NodeMemo.sync` drops the answers of every node the ledger changed since (a
decision costs what changed, not what the cluster holds), and `NodeMemo.forget` drops a node's
answers when its inventory changes or goes. Those two are the rule; nobody else drops or trusts
answers. The tables are what decisions read in bulk: at 1,000 nodes a decision is a few set-like
passes over the node names, not a thousand lookups.
Answers that read no GPU identity depend only on a node's shape and usage (`by_shape`), so
nodes alike share them. Bounded: past MAX_KEYS keys everything is dropped, past MAX_SHARED
shape answers all of those; later calls refill. Nothing else is cached here (quota, blocked
nodes, in-flight pods are read fresh on every call).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rocshare.core.ledger import Ledger


@dataclass(slots=True)
class KeyMemo:
    """One key's answers, valid as of `synced` in `ledger`'s journal."""

    fits: dict[str, float] = field(default_factory=dict)
    """Node name -> the pod's score there."""
    misfits: dict[str, Any] = field(default_factory=dict)
    """Node name -> why the pod does not fit there."""
    by_shape: dict[tuple, Any] = field(default_factory=dict)
    """(node shape, usage) -> the answer, for keys whose answers read no GPU id."""
    ledger: Ledger | None = None
    synced: int = 0
    request: Any = None
    """The pod request the key was first asked for: what `decisions.refresh` plans with."""
    asked: int = 0
    """`NodeMemo.asked` when the key was last asked for."""

    def store(self, name: str, answer: Any) -> None:
        """A score (a number) or a rejection (anything else), computed from the node as it is now."""
        if isinstance(answer, float | int):
            self.fits[name] = answer
        else:
            self.misfits[name] = answer

    def store_all(self, fits: Iterable[tuple[str, float]], misfits: Iterable[tuple[str, Any]]) -> None:
        """`store` for many nodes: (name, score) pairs and (name, rejection) pairs."""
        self.fits.update(fits)
        self.misfits.update(misfits)

    def drop(self, name: str) -> None:
        self.fits.pop(name, None)
        self.misfits.pop(name, None)

    def holds(self, name: str) -> bool:
        return name in self.fits or name in self.misfits


class NodeMemo:
    """Every key's `KeyMemo`, bounded."""

    MAX_KEYS = 64
    MAX_SHARED = 100_000
    RECENT_ASKS = 256
    """Keys asked for within this many asks are `behind`'s to bring up to date (rarer ones are
    planned again by their next decision)."""

    def __init__(self) -> None:
        self._keys: dict[Hashable, KeyMemo] = {}
        self._shared = 0
        self.asked = 0

    def answers(self, key: Hashable, ledger: Ledger, request: Any = None) -> KeyMemo:
        """The key's answers, every one still valid against `ledger` as it is now."""
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) >= self.MAX_KEYS:
                self.clear()
            found = self._keys[key] = KeyMemo(request=request)
        self.asked += 1
        found.asked = self.asked
        self.sync(found, ledger)
        return found

    def behind(self, ledger: Ledger) -> list[KeyMemo]:
        """Recently asked keys whose answers predate a change of the ledger."""
        end, recent = ledger.journal_end, self.asked - self.RECENT_ASKS
        return [memo for memo in self._keys.values()
                if memo.request is not None and memo.asked > recent and memo.ledger is ledger and memo.synced < end]

    @staticmethod
    def sync(memo: KeyMemo, ledger: Ledger) -> None:
        """Drop the answers of nodes the ledger changed since the memo last looked."""
        changed = ledger.changed_since(memo.synced) if memo.ledger is ledger else None
        if changed is None:
            memo.fits.clear()
            memo.misfits.clear()
            memo.ledger = ledger
        else:
            for name in set(changed):
                memo.drop(name)
        memo.synced = ledger.journal_end

    def share(self, memo: KeyMemo, shape_key: tuple, value: Any) -> None:
        if self._shared >= self.MAX_SHARED:
            for each in self._keys.values():
                each.by_shape.clear()
            self._shared = 0
        memo.by_shape[shape_key] = value
        self._shared += 1

    def forget(self, name: str) -> None:
        """The node's inventory changed or went: none of its answers hold."""
        for memo in self._keys.values():
            memo.drop(name)

    def holds(self, name: str) -> bool:
        """Whether any key holds an answer for the node."""
        return any(memo.holds(name) for memo in self._keys.values())

    def clear(self) -> None:
        self._keys.clear()
        self._shared = 0
