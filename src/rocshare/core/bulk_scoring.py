"""The scorers of policies.py and the measure of fragmentation.py, on (GPUs, nodes) numpy arrays.

Each function here is its scalar counterpart applied elementwise, written so every float comes
out bit for bit as the scalar code makes it (the bulk planner's answers must equal
`PodPlanner.plan`'s: scores are compared with max, and ties matter):

* the same operations in the same order on the same operands: ints become floats where Python
  converts them, divisions are IEEE divisions of the same doubles, no operation is fused;
* sums of floats are taken one term at a time in the scalar order, elementwise across nodes (a
  node's used fraction GPU by GPU, the expected fragmentation task by task), never by numpy's
  pairwise `sum`; sums of ints (free shares, GPU counts) are exact in any order;
* `math.exp` is applied in Python to each distinct value (`fgd_scores`), never `np.exp`;
* a choice between two floats is `np.where`, never arithmetic (x + 0 * y is not x for every y);
  between ints, arithmetic is exact (and faster than `np.where` on ints).

The fragmentation measure decomposes per typical task: the GPUs that could host it (free share at
least its need, product accepted) and the free share of the others. A placement changes one GPU's
free share, so its after-state is the before-state's counts corrected for that GPU: O(tasks) per
candidate GPU instead of a walk over the node. Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rocshare.core.fleet import ShapeTable
from rocshare.core.fragmentation import MILLI, FragmentationModel
from rocshare.core.policies import GROWTH_STEP_MILLI, PACKING_WEIGHT, ScoringContext, fgd_score


@dataclass(frozen=True, slots=True)
class GpuArrays:
    """The spec numbers of some nodes' GPUs, (GPUs, nodes) each, gathered from their shape table."""

    memory_mib: np.ndarray
    cu_count: np.ndarray
    cu_usable: np.ndarray
    max_slices: np.ndarray
    product: np.ndarray
    healthy: np.ndarray
    partition: np.ndarray

    @classmethod
    def of(cls, table: ShapeTable, shape: np.ndarray) -> GpuArrays:
        """The GPUs of nodes whose shape ids are `shape`."""
        return cls(table.memory_mib[:, shape], table.cu_count[:, shape], table.cu_usable[:, shape],
                   table.max_slices[:, shape], table.product[:, shape], table.healthy[:, shape],
                   table.partition[:, shape])


def free_shares(loads: np.ndarray, gpus: GpuArrays) -> np.ndarray:
    """headroom.free_share_milli of every GPU under `loads` (4, GPUs, nodes)."""
    memory_held, slices, cu_held, whole = loads
    memory_share = (gpus.memory_mib - memory_held) * MILLI // np.maximum(gpus.memory_mib, 1)
    cu_share = (gpus.cu_count - cu_held) * MILLI // np.maximum(gpus.cu_count, 1)
    share = memory_share + (gpus.cu_count != 0) * (np.minimum(memory_share, cu_share) - memory_share)
    share += gpus.partition * ((slices == 0) * MILLI - share)
    alive = gpus.healthy & (whole == 0) & (slices < gpus.max_slices) & (gpus.memory_mib != 0)
    return share * alive


def used_fractions(loads: np.ndarray, gpus: GpuArrays) -> np.ndarray:
    """policies.used_fraction of every GPU under `loads`: 1.0 for a dimension the GPU lacks."""
    memory = loads[0] / np.maximum(gpus.memory_mib, 1)
    memory[gpus.memory_mib == 0] = 1.0
    cores = loads[2] / np.maximum(gpus.cu_count, 1)
    cores[gpus.cu_count == 0] = 1.0
    return (memory + cores) / 2


def node_used_fractions(used: np.ndarray, healthy: np.ndarray) -> np.ndarray:
    """policies.node_used_fraction: the healthy GPUs' used fractions summed GPU by GPU, averaged
    (an unhealthy GPU adds 0.0, which leaves the non-negative sum as it is; none healthy: 0.0)."""
    total = np.zeros(used.shape[1])
    for gpu in range(len(used)):
        total += used[gpu] * healthy[gpu]
    return total / np.maximum(healthy.sum(axis=0), 1)


def packings(cpu_after: np.ndarray, cpu_tracked: np.ndarray, gpu_left: np.ndarray, ctx: ScoringContext) -> np.ndarray:
    """policies.packing, with the free share after (`gpu_left`) given."""
    cpu_left = cpu_after * cpu_tracked
    return 1.0 - 0.5 * cpu_left / ctx.cpu_norm_milli - 0.5 * gpu_left / ctx.gpu_norm_milli


def bestfit_scores(packing: np.ndarray) -> np.ndarray:
    """policies.node_bestfit: float(int(packing * 100)), truncated towards zero."""
    return (packing * 100).astype(np.int64).astype(np.float64)


def fgd_scores(growth: np.ndarray) -> np.ndarray:
    """policies.fgd_score of each value, through math.exp once per distinct value."""
    values, inverse = np.unique(growth, return_inverse=True)
    scored = np.array([fgd_score(value) for value in values.tolist()], np.float64)
    return scored[inverse.reshape(-1)].reshape(growth.shape)


def fragmentation_scores(growth: np.ndarray, packing: np.ndarray) -> np.ndarray:
    """policies.node_fragmentation from its growth: floor(-growth / step) + weight * packing (the
    `+ 0.0` makes floor's -0.0 the 0 that math.floor gives)."""
    return (np.floor(-growth / GROWTH_STEP_MILLI) + 0.0) + PACKING_WEIGHT * packing


class TaskArrays:
    """A fragmentation model's typical tasks as arrays, for nodes whose products have these codes.

    Per-task arrays are (tasks, GPUs, nodes), of the free shares' integer type; every count and sum
    here is an exact integer until `_weighted` turns them into the expected value, task by task."""

    def __init__(self, model: FragmentationModel, products: list[str]) -> None:
        tasks = model.workload.tasks
        self.model = model
        need = np.array([t.share_milli for t in tasks], np.int64)[:, None, None]
        gpus = np.array([t.gpus for t in tasks], np.int64)
        self._need = {np.dtype(np.int64): need, np.dtype(np.int32): _narrowed(need)}
        """Per free-share type: int32 only for shares in [-10**6, 1000] on nodes of at most 1000 GPUs,
        where a need or GPU count above 1001 compares as 1001 does (never met) and one below -2**31
        as -2**31 (always met)."""
        self._gpus = {np.dtype(np.int64): gpus, np.dtype(np.int32): _narrowed(gpus)}
        self.asks_gpus = (gpus != 0)[:, None]
        self.cpu = np.array([t.cpu_milli for t in tasks], np.int64)[:, None]
        self.weights = [float(t.weight) for t in tasks]  # an int weight gives the same sums below 2**53
        self.thresholds = np.array(model.cpu_thresholds, np.int64)
        self.below = np.array((-1, *model.cpu_thresholds), np.int64)
        """Per CPU bucket (bisect_right of the free CPU), the largest task CPU that still fits."""
        access = np.array([model.access(product) for product in products], bool).reshape(len(products), len(tasks))
        self.access = None if access.all() else np.ascontiguousarray(access.T)
        """(tasks, products): whether the task accepts the product; None when every task takes any."""

    def access_of(self, product: np.ndarray) -> np.ndarray | None:
        """(tasks, GPUs, nodes) acceptance of the GPUs' products, or None (every task takes any)."""
        return None if self.access is None else self.access[:, product]

    def cpu_below(self, cpu_free: np.ndarray, tracked: np.ndarray) -> np.ndarray:
        """Per node, the CPU bound the measure compares each task's CPU with (untracked: all fit)."""
        bucket = np.searchsorted(self.thresholds, cpu_free, side="right")
        return self.below[np.where(tracked, bucket, len(self.thresholds))]

    def _hosting(self, below: np.ndarray) -> np.ndarray:
        """(tasks, nodes): whether the task counts hosts at all (it asks GPUs and its CPU fits)."""
        return self.asks_gpus & (self.cpu <= below)

    def _hosts(self, free: np.ndarray, access: np.ndarray | None) -> np.ndarray:
        """(tasks, GPUs, nodes): whether the GPU could host the task (free share enough, product accepted)."""
        host = free >= self._need[free.dtype]
        return host if access is None else host & access

    def expected(self, free: np.ndarray, access: np.ndarray | None, below: np.ndarray) -> tuple[np.ndarray, tuple]:
        """FragmentationModel.node_fragmentation per node, and the per-task parts `expected_each` reads."""
        host = self._hosts(free, access)
        hosts = host.sum(axis=1, dtype=free.dtype)
        small = (free * ~host).sum(axis=1, dtype=free.dtype)
        total = free.sum(axis=0, dtype=free.dtype)
        fits = self._hosting(below) & (hosts >= self._gpus[free.dtype][:, None])
        fragment = total + fits * (small - total)
        return self._weighted(fragment, total), (host, hosts, small, total)

    def expected_each(self, free: np.ndarray, free_after: np.ndarray, access: np.ndarray | None,
                      below_after: np.ndarray, parts: tuple) -> np.ndarray:
        """(GPUs, nodes): the node's measure with only that GPU's free share changed to `free_after`:
        the before-state's per-task counts, corrected for that GPU."""
        host, hosts, small, total = parts
        host_after = self._hosts(free_after, access)
        hosts_after = hosts[:, None, :] - host + host_after
        small_after = small[:, None, :] + free_after * ~host_after - free * ~host
        total_after = total - free + free_after
        fits = self._hosting(below_after)[:, None, :] & (hosts_after >= self._gpus[free.dtype][:, None, None])
        fragment = total_after + fits * (small_after - total_after)
        return self._weighted(fragment, total_after)

    def _weighted(self, fragment: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Sum of weight x fragment over the tasks (axis 0), one task after another, a product and a
        sum each, as Python rounds them; 0.0 where the node has no free share at all."""
        expected = np.zeros(fragment.shape[1:])
        term = np.empty(fragment.shape[1:])
        for task, weight in enumerate(self.weights):
            np.multiply(fragment[task], weight, out=term)
            expected += term
        expected[total == 0] = 0.0
        return expected

    def stranded(self, free_total: np.ndarray, cpu_free: np.ndarray, tracked: np.ndarray) -> np.ndarray:
        """FragmentationModel.stranded_milli per node."""
        if not self.model.gpu_per_cpu:
            return np.zeros(len(free_total))
        stranded = free_total - cpu_free * self.model.gpu_per_cpu
        return np.where(tracked & (stranded > 0.0), stranded, 0.0)


def _narrowed(values: np.ndarray) -> np.ndarray:
    return np.clip(values, -2**31, 1001).astype(np.int32)
