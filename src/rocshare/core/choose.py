"""Choosing which of a node's fitting GPUs a container gets.

Constraints first, preference second: with numa-bind every chosen GPU is on one NUMA node
(an unknown NUMA node counts as one group: single-socket desktops report -1); with
link-bind every pair of chosen GPUs is joined by XGMI. Among the sets that satisfy them, the
GPU policy decides: per-GPU scores summed, and for ``topology-aware`` the set with the most
XGMI links first, then one NUMA node, then the scores. Small candidate sets are searched
exhaustively; big ones (partitions) greedily, so the cost stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from math import comb

from rocshare.api.models import GpuPolicy
from rocshare.core.fit import Reason
from rocshare.core.inventory import NodeInventory
from rocshare.core.request import Selection

EXHAUSTIVE_LIMIT = 512
"""Largest number of GPU sets scored one by one; above it the search is greedy."""


def choose_gpus(
    node: NodeInventory,
    candidates: Sequence[int],
    count: int,
    selection: Selection,
    policy: GpuPolicy,
    score: Callable[[int], float],
) -> tuple[int, ...] | Reason:
    """``count`` positions from ``candidates``, or the reason no allowed set exists."""
    if count == 1:  # no set constraint binds one GPU: the best score, the lowest position on ties
        return (max(candidates, key=lambda pos: (score(pos), -pos)),)
    groups = _numa_groups(node, candidates, count) if selection.numa_bind and count > 1 else [list(candidates)]
    if not groups:
        return Reason.NUMA_NOT_FIT
    scores = {pos: score(pos) for pos in candidates}
    needs_sets = count > 1 and (selection.link_bind or policy == GpuPolicy.TOPOLOGY_AWARE)
    best: tuple[tuple, tuple[int, ...]] | None = None
    for group in groups:
        if needs_sets:
            chosen = _best_set(node, group, count, scores, selection.link_bind, policy == GpuPolicy.TOPOLOGY_AWARE)
        else:
            chosen = tuple(sorted(sorted(group, key=lambda p: (-scores[p], p))[:count]))
        if chosen is None:
            continue
        rank = _set_rank(node, chosen, scores, policy == GpuPolicy.TOPOLOGY_AWARE)
        if best is None or rank > best[0]:
            best = (rank, chosen)
    if best is None:
        return Reason.LINK_NOT_FIT
    return best[1]


def _numa_groups(node: NodeInventory, candidates: Sequence[int], count: int) -> list[list[int]]:
    groups: dict[int | None, list[int]] = {}
    for pos in candidates:
        groups.setdefault(node.gpus[pos].numa, []).append(pos)
    return [group for group in groups.values() if len(group) >= count]


def _links_within(node: NodeInventory, chosen: Sequence[int]) -> int:
    return sum(1 for a, b in combinations(chosen, 2) if b in node.links[a])


def _is_clique(node: NodeInventory, chosen: Sequence[int]) -> bool:
    return all(b in node.links[a] for a, b in combinations(chosen, 2))


def _set_rank(node: NodeInventory, chosen: tuple[int, ...], scores: dict[int, float], topology: bool) -> tuple:
    total = sum(scores[p] for p in chosen)
    if not topology:
        return (total,)
    one_numa = len({node.gpus[p].numa for p in chosen}) == 1
    return (_links_within(node, chosen), one_numa, total)


def _best_set(
    node: NodeInventory, group: list[int], count: int, scores: dict[int, float], cliques_only: bool, topology: bool
) -> tuple[int, ...] | None:
    if len(group) < count:
        return None
    if comb(len(group), count) > EXHAUSTIVE_LIMIT:
        return _greedy_set(node, group, count, scores, cliques_only)
    best: tuple[tuple, tuple[int, ...]] | None = None
    for chosen in combinations(sorted(group), count):
        if cliques_only and not _is_clique(node, chosen):
            continue
        rank = _set_rank(node, chosen, scores, topology)
        if best is None or rank > best[0]:
            best = (rank, chosen)
    return None if best is None else best[1]


def _greedy_set(node: NodeInventory, group: list[int], count: int, scores: dict[int, float], cliques_only: bool):
    ordered = sorted(group, key=lambda p: (-scores[p], p))
    for seed in ordered:
        chosen = [seed]
        for pos in ordered:
            if pos in chosen:
                continue
            linked = all(pos in node.links[c] for c in chosen)
            if linked or not cliques_only:
                chosen.append(pos)
            if len(chosen) == count:
                return tuple(sorted(chosen))
    return None
