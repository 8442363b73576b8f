"""Expected fragmentation of a node under a typical workload (the FGD measure, ATC'23).

A typical task asks ``gpus`` GPUs of ``share_milli`` thousandths each (0 = CPU only), some
CPU, and accepts some GPU products. A GPU's free share (rocshare.core.headroom) is the smaller
of its free memory and free CU fractions, in milli (0 when it is unhealthy, held whole or out
of slices): the one number that says how big a slice it could still host. For one task, a node's fragmentation
is all its free share when the task cannot run there (CPU, GPU count, product) or asks no
GPU at all (a CPU-only task can use none of it: the paper's simulator counts it so too),
otherwise the free share of the GPUs too small for the task. A node's expected fragmentation
is the task-probability-weighted sum. Lower is better; a placement's cost is the growth.

``stranded_milli`` is the CPU-side complement FGD lacks: FGD sees CPU only when a task no
longer fits at all, so it lets CPU-heavy pods drain a GPU-dense node until its last free
GPUs can never be used. The stranded share is the free GPU share beyond what the node's
free CPU can feed at the typical workload's GPU-per-CPU ratio.

``FragmentationModel`` memoises per (products, CPU bucket, sorted shares): CPU matters
only through which task CPU thresholds it clears, so the number of distinct keys stays small.
The memo lives in the object its caller owns; nothing here is global.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from rocshare.core.fit import Load
from rocshare.core.headroom import MILLI, free_share_milli, free_shares
from rocshare.core.inventory import NodeInventory

__all__ = ["MILLI", "FragmentationModel", "TypicalTask", "TypicalWorkload", "free_share_milli"]
MEMO_LIMIT = 500_000


@dataclass(frozen=True, slots=True)
class TypicalTask:
    cpu_milli: int
    gpus: int
    share_milli: int
    types: tuple[str, ...] = ()
    """Lower-case products the task accepts (substring match); empty = any."""
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class TypicalWorkload:
    tasks: tuple[TypicalTask, ...]

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[int, int, int, tuple[str, ...]]], coverage: float = 0.95) -> TypicalWorkload:
        """Group (cpu_milli, gpus, share_milli, types) samples; keep the most frequent groups
        until they cover ``coverage`` of samples; weights are renormalised to sum to 1."""
        counts = Counter(samples)
        total = sum(counts.values())
        # Most frequent first; ties broken by the group itself so the result is deterministic.
        ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        kept: list[tuple[tuple, int]] = []
        covered = 0
        for group, count in ordered:
            if total and covered / total >= coverage:
                break
            kept.append((group, count))
            covered += count
        return cls(tuple(TypicalTask(c, g, s, t, n / covered) for (c, g, s, t), n in kept))

    @property
    def gpu_milli_per_cpu_milli(self) -> float:
        """GPU-milli the typical GPU task asks per CPU-milli (0 = no GPU task asks CPU)."""
        tasks = [t for t in self.tasks if t.gpus]
        cpu = sum(t.weight * t.cpu_milli for t in tasks)
        return sum(t.weight * t.gpus * t.share_milli for t in tasks) / cpu if cpu else 0.0


class FragmentationModel:
    """The measure for one typical workload, with a memo owned by this object."""

    def __init__(self, workload: TypicalWorkload) -> None:
        self.workload = workload
        self._thresholds = tuple(sorted({t.cpu_milli for t in workload.tasks}))
        self._memo: dict[tuple, float] = {}
        self._access: dict[str, tuple[bool, ...]] = {}
        self.gpu_per_cpu = workload.gpu_milli_per_cpu_milli

    @property
    def cpu_thresholds(self) -> tuple[int, ...]:
        """The tasks' distinct CPU asks, ascending: free CPU matters only through which it clears."""
        return self._thresholds

    def stranded_milli(self, free_milli: int, cpu_free_milli: int | None) -> float:
        """Free GPU share the node's free CPU cannot feed (CPU untracked: none)."""
        if cpu_free_milli is None or not self.gpu_per_cpu:
            return 0.0
        return max(0.0, free_milli - cpu_free_milli * self.gpu_per_cpu)

    def node_fragmentation(self, node: NodeInventory, loads: tuple[Load, ...], cpu_free_milli: int | None = None,
                           free_milli: tuple[int, ...] | None = None) -> float:
        """Expected fragmented milli of the node; cpu_free None = CPU not tracked (always fits).
        ``free_milli``: the GPUs' free shares under ``loads``, when the caller has them already."""
        bucket = len(self._thresholds) if cpu_free_milli is None else bisect_right(self._thresholds, cpu_free_milli)
        fast_key = (node.shape, loads, bucket)
        value = self._memo.get(fast_key)
        if value is not None:
            return value
        if free_milli is None:
            free_milli = free_shares(node, loads)
        shares = tuple(sorted(zip([spec.product_lower for spec in node.gpus], free_milli)))
        key = (shares, bucket)
        value = self._memo.get(key)
        if value is None:
            value = self._compute(shares, bucket)
        if len(self._memo) > MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = self._memo[fast_key] = value
        return value

    def _compute(self, shares: tuple[tuple[str, int], ...], bucket: int) -> float:
        total_free = sum(share for _, share in shares)
        if not total_free:
            return 0.0
        cpu_ok_below = self._thresholds[bucket - 1] if bucket else -1
        expected = 0.0
        for position, task in enumerate(self.workload.tasks):
            expected += task.weight * self._task_fragmentation(task, position, shares, total_free, cpu_ok_below)
        return expected

    def _task_fragmentation(self, task: TypicalTask, position: int, shares, total_free: int, cpu_ok_below: int) -> int:
        if not task.gpus or task.cpu_milli > cpu_ok_below:
            # A CPU-only task can use none of the free GPU, whether it fits or not: all of it
            # is fragment from its point of view (the paper's simulator does the same).
            return total_free
        need = task.share_milli
        hosts = 0
        small = 0
        if task.types:
            for product, share in shares:
                if share >= need and self._accepts(product, position):
                    hosts += 1
                else:
                    small += share
        else:  # any product will do (most tasks): no acceptance look-up per GPU
            for _, share in shares:
                if share >= need:
                    hosts += 1
                else:
                    small += share
        return small if hosts >= task.gpus else total_free

    def _accepts(self, product: str, position: int) -> bool:
        return self.access(product)[position]

    def access(self, product: str) -> tuple[bool, ...]:
        """Per task, in the workload's order: whether it accepts a GPU of this (lower-case) product."""
        access = self._access.get(product)
        if access is None:
            access = tuple(not t.types or any(x in product for x in t.types) for t in self.workload.tasks)
            self._access[product] = access
        return access
