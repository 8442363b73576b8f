"""The plan cache: answers of the core planner per (pod shape, policy) and node, and the one
rule that says when an answer may be reused.

An answer for a node is a pure function of (the node's inventory, its ledger usage, the key),
so it is valid exactly while the node's ledger version and `NodeInventory` object are the ones
it was computed from: the ledger bumps the version on every apply or release on the node, and a
changed inventory is a new object. `KeyMemo.lookup` applies that rule; nobody else does.
Answers that read no GPU identity depend only on a node's shape and usage (`by_shape`), so
nodes alike share them. Bounded: past MAX_KEYS keys everything is dropped, past MAX_SHARED
shape answers all of those; later calls refill. Nothing else is cached here (quota, blocked
nodes, in-flight pods are read fresh on every call).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from rocshare.core.inventory import NodeInventory

MISSING: Any = object()
"""What `KeyMemo.lookup` returns when no valid answer is cached."""


@dataclass(slots=True)
class KeyMemo:
    """One key's answers."""

    by_node: dict[str, tuple[int, NodeInventory, Any]] = field(default_factory=dict)
    """Node name -> (its ledger version, its inventory, the answer computed from them)."""
    by_shape: dict[tuple, Any] = field(default_factory=dict)
    """(node shape, usage) -> the answer, for keys whose answers read no GPU id."""

    def lookup(self, name: str, version: int, node: NodeInventory) -> Any:
        """The answer computed from exactly this ledger version and inventory, or MISSING."""
        entry = self.by_node.get(name)
        if entry is not None and entry[0] == version and entry[1] is node:
            return entry[2]
        return MISSING

    def store(self, name: str, version: int, node: NodeInventory, answer: Any) -> None:
        self.by_node[name] = (version, node, answer)


class NodeMemo:
    """Every key's `KeyMemo`, bounded."""

    MAX_KEYS = 64
    MAX_SHARED = 100_000

    def __init__(self) -> None:
        self._keys: dict[Hashable, KeyMemo] = {}
        self._shared = 0

    def answers(self, key: Hashable) -> KeyMemo:
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) >= self.MAX_KEYS:
                self.clear()
            found = self._keys[key] = KeyMemo()
        return found

    def share(self, memo: KeyMemo, shape_key: tuple, value: Any) -> None:
        if self._shared >= self.MAX_SHARED:
            for each in self._keys.values():
                each.by_shape.clear()
            self._shared = 0
        memo.by_shape[shape_key] = value
        self._shared += 1

    def forget(self, name: str) -> None:
        for memo in self._keys.values():
            memo.by_node.pop(name, None)

    def holds(self, name: str) -> bool:
        """Whether any key holds an answer for the node."""
        return any(name in memo.by_node for memo in self._keys.values())

    def clear(self) -> None:
        self._keys.clear()
        self._shared = 0
