"""One pod planned over many nodes at once, on numpy arrays: `PodPlanner.plan`'s answers, in bulk.

For the first pod of a never-seen shape the extender plans every node (issue 18's cold path);
the scalar planner spends tens of microseconds of interpreter work per node. `BulkPlanner`
answers the common request forms for a whole list of nodes with array operations over the
columns fleet.py keeps: one GPU container asking k GPUs, no uuid filter, and, when k > 1, no NUMA
or link constraint and no topology-aware set search (`handles`); every other request goes to the
scalar planner. Every node scorer and GPU scorer of policies.py is covered (`GPU_KINDS`,
`NODE_KINDS`, keyed by the registries' own functions, so a scorer added there falls back to the
scalar planner until it is written here too).

The steps are the scalar planner's, elementwise: host CPU and memory first; per GPU the first
failing reason in fit.py's order (the shape's barred and unoffered reasons, then exclusivity,
slices, memory, cores) as a code, counted per node into the same `FitFailure` objects (one per
distinct count vector); per candidate GPU the GPU scorer's score; the choice is the best score,
the lowest position on ties (k > 1: the k best by (-score, position), as choose.py does); then
the node scorer on the after-state. The answers are exactly `PodPlanner.plan`'s score or
failure for each node (bulk_scoring.py says how floats are kept bit-identical); tests compare
the two, scores, chosen GPUs and failures, on random fleets for every policy. What depends only
on a node's shape (needs, barred GPUs) is the scalar planner's own `shape_facts`, worked out once
per shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np

from rocshare.api.models import GpuPolicy
from rocshare.core import policies
from rocshare.core.allocate import PodPlanner
from rocshare.core.bulk_scoring import (
    GpuArrays, TaskArrays, bestfit_scores, fgd_scores, fragmentation_scores, free_shares, node_used_fractions,
    packings, used_fractions)
from rocshare.core.fit import FitFailure, Reason
from rocshare.core.fleet import Block, FleetArrays, ShapeTable
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import NODE_SCORERS, Policy, gpu_scorer_for
from rocshare.core.request import PodRequest

GPU_KINDS = {policies.gpu_binpack: "binpack", policies.gpu_spread: "spread",
             policies.gpu_fragmentation: "fragmentation", policies.gpu_fgd: "fgd"}
NODE_KINDS = {policies.node_binpack: "binpack", policies.node_spread: "spread", policies.node_bestfit: "bestfit",
              policies.node_fgd: "fgd", policies.node_fragmentation: "fragmentation"}
REASONS = tuple(Reason)
CODE = {reason: code for code, reason in enumerate(REASONS, start=1)}
"""A reason's code: its rank in fit.py's order, plus one (0 = the GPU fits)."""
EXCLUSIVE, SLICES, MEMORY, CORES = (CODE[r] for r in (
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, Reason.CARD_TIME_SLICING_EXHAUSTED, Reason.CARD_INSUFFICIENT_MEMORY,
    Reason.CARD_INSUFFICIENT_CORE))
NODE_CPU, NODE_MEMORY, NODE_GPUS = (CODE[r] for r in (
    Reason.NODE_INSUFFICIENT_CPU, Reason.NODE_INSUFFICIENT_MEMORY, Reason.NODE_INSUFFICIENT_GPUS))
CHUNK_CELLS = 1 << 17
"""(task, GPU, node) cells per chunk of nodes: bounds the temporaries (about a MiB each) at any fleet size."""


def handles(request: PodRequest, policy: Policy) -> bool:
    """Whether `BulkPlanner` answers this request under this policy (else: the scalar planner)."""
    containers = request.gpu_containers
    selection = request.selection
    if len(containers) != 1 or selection.use_uuids or selection.nouse_uuids:
        return False
    if containers[0].gpus > 1 and (selection.numa_bind or selection.link_bind
                                   or policy.gpu == GpuPolicy.TOPOLOGY_AWARE):
        return False
    return gpu_scorer_for(policy) in GPU_KINDS and NODE_SCORERS[policy.node] in NODE_KINDS


@dataclass(frozen=True, slots=True)
class BulkAnswers:
    """Per listed node, its score or its failure: `failures[failure_ids[i]]` for `misfit_names[i]`."""

    fit_names: list[str]
    scores: list[float]
    misfit_names: list[str]
    failure_ids: list[int]
    failures: list[FitFailure]
    positions: list[tuple[int, ...]] | None = None
    """Per node that fits (as `fit_names`), the GPU positions chosen; when asked for."""


@dataclass(frozen=True, slots=True)
class _Needs:
    """The container's need of each GPU, per shape of a block: (GPUs, shapes) arrays."""

    memory_mib: np.ndarray
    pin_cus: np.ndarray
    whole: np.ndarray
    reserves_all: np.ndarray
    adds: np.ndarray
    """(4, GPUs, shapes): the load the need adds."""
    barred: np.ndarray
    """The code of the reason no load changes (health, type, not offered), 0 for none."""
    known: np.ndarray
    """(shapes,): whether the shape's column is filled."""


@dataclass(frozen=True, slots=True)
class _State:
    """The nodes that fit, before the pod: loads, free shares, host CPU free (where tracked)."""

    loads: np.ndarray
    free: np.ndarray
    cpu_free: np.ndarray
    cpu_tracked: np.ndarray


class BulkPlanner:
    """`PodPlanner.plan` of one request for many nodes (`handles` must hold for it)."""

    def __init__(self, planner: PodPlanner) -> None:
        self.planner = planner
        self.request = planner.request
        self.ctx = planner.ctx
        self.gpus = planner.request.gpu_containers[0].gpus
        self.gpu_kind = GPU_KINDS[gpu_scorer_for(planner.policy)]
        self.node_kind = NODE_KINDS[NODE_SCORERS[planner.policy.node]]
        reads_model = self.gpu_kind in ("fragmentation", "fgd") or self.node_kind in ("fgd", "fragmentation")
        self.model = planner.ctx.fragmentation if reads_model else None
        self._tasks: TaskArrays | None = None
        self._tasks_of: tuple[dict[str, int] | None, int] = (None, 0)
        """The product codes `_tasks` was made for (the fleet's table, and how many it held)."""
        self._needs: dict[int, tuple[ShapeTable, _Needs]] = {}
        self._failure_ids: dict[tuple, int] = {}
        self._failures: list[FitFailure] = []

    def plan(self, fleet: FleetArrays, names: Sequence[str], nodes: Sequence[NodeInventory], ledger: Ledger,
             inventories: Mapping[str, NodeInventory], *, positions: bool = False) -> BulkAnswers:
        """The answer for each of `names` (nodes with GPUs; `nodes[i]` is `names[i]`'s inventory).
        `positions`: also the GPUs chosen on each node that fits (for tests: the plan's choice)."""
        batches = fleet.locate(names, nodes, ledger, inventories)
        if self.model is not None and self._tasks_of != (fleet.products, len(fleet.products)):
            self._tasks = TaskArrays(self.model, list(fleet.products))
            self._tasks_of = (fleet.products, len(fleet.products))
        tasks = len(self._tasks.weights) if self._tasks is not None else 1
        fits = np.zeros(len(names), bool)
        scores = np.zeros(len(names))
        failure_ids = np.zeros(len(names), np.int64)
        chosen: dict[int, tuple[int, ...]] = {}
        for batch in batches:
            step = max(1, CHUNK_CELLS // (batch.block.width * max(1, tasks)))
            for start in range(0, len(batch.columns), step):
                at = batch.positions[start:start + step]
                fit, score, failed, picked = self._chunk(batch.block, batch.columns[start:start + step])
                fits[at] = fit
                scores[at[fit]] = score
                failure_ids[at[~fit]] = failed
                if positions:
                    chosen.update(zip(at[fit].tolist(), (tuple(np.flatnonzero(c).tolist()) for c in picked.T)))
        return BulkAnswers(list(compress(names, fits.tolist())), scores[fits].tolist(),
                           list(compress(names, (~fits).tolist())), failure_ids[~fits].tolist(), self._failures,
                           [chosen[i] for i in np.flatnonzero(fits).tolist()] if positions else None)

    # ---- fit ------------------------------------------------------------------------------------

    def _chunk(self, block: Block, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fits per node, scores of the nodes that fit, failure ids of the others, GPUs chosen where it fits)."""
        table = block.shapes.build()
        shape = block.shape[columns]
        loads, host = block.loads[:, :, columns], block.host[:, columns]
        node_cpu, node_memory = table.node_cpu_milli[shape], table.node_memory_mib[shape]
        cpu_short = (node_cpu != 0) & (host[0] + self.request.cpu_milli > node_cpu)
        memory_short = ~cpu_short & (node_memory != 0) & (host[1] + self.request.memory_mib > node_memory)
        needs = self._needs_of(block, shape)
        code = _reason_codes(loads, table, needs, shape)
        candidates = code == 0
        fits = ~cpu_short & ~memory_short & (candidates.sum(axis=0) >= self.gpus)
        failed = ~fits
        failure_ids = self._failure_ids_of(code[:, failed], cpu_short[failed], memory_short[failed], block.width)
        kept = shape[fits]
        before = _State(loads[:, :, fits], block.free[:, columns[fits]], node_cpu[fits] - host[0, fits],
                        node_cpu[fits] != 0)
        scores, chosen = self._scores(before, GpuArrays.of(table, kept), needs.adds[:, :, kept], candidates[:, fits])
        return fits, scores, failure_ids, chosen

    def _needs_of(self, block: Block, shape: np.ndarray) -> _Needs:
        """The request's needs for every shape the nodes have (worked out once per shape)."""
        table = block.shapes
        kept = self._needs.get(id(table))
        needs = kept[1] if kept is not None and kept[0] is table else None
        if needs is None or len(needs.known) < len(table.nodes):
            needs = _grown_needs(needs, len(table.nodes), block.width)
            self._needs[id(table)] = (table, needs)
        if not needs.known.all():
            for sid in np.unique(shape).tolist():
                if not needs.known[sid]:
                    self._fill_needs(needs, sid, table.nodes[sid])
        return needs

    def _fill_needs(self, needs: _Needs, sid: int, node: NodeInventory) -> None:
        fits, barred = self.planner.shape_facts(node)
        fit = fits[0]
        needs.memory_mib[:, sid] = [need.memory_mib for need in fit.needs]
        needs.pin_cus[:, sid] = [need.pin_cus for need in fit.needs]
        needs.whole[:, sid] = [need.whole for need in fit.needs]
        needs.reserves_all[:, sid] = [need.reserves_all for need in fit.needs]
        needs.adds[:, :, sid] = np.array(fit.adds, np.int64).T
        needs.barred[:, sid] = [CODE[reason] if reason else 0
                                for reason in (b or u for b, u in zip(barred, fit.unoffered))]
        needs.known[sid] = True

    def _failure_ids_of(self, code: np.ndarray, cpu_short: np.ndarray, memory_short: np.ndarray,
                        width: int) -> np.ndarray:
        """Each failing node's failure: GPUs per reason code (the fitting ones as NodeInsufficientGPUs),
        or the whole node for a host shortfall; one FitFailure per distinct vector."""
        nodes = code.shape[1]
        if not nodes:
            return np.zeros(0, np.int64)
        width_codes = len(REASONS) + 1
        flat = (code + width_codes * np.arange(nodes)).reshape(-1)
        counts = np.bincount(flat, minlength=nodes * width_codes).reshape(nodes, width_codes)
        counts[:, NODE_GPUS] = counts[:, 0]
        counts[:, 0] = 0
        counts[cpu_short] = 0
        counts[cpu_short, NODE_CPU] = width
        counts[memory_short] = 0
        counts[memory_short, NODE_MEMORY] = width
        first, inverse = _distinct_rows(counts, width + 1)
        ids = np.array([self._failure_id(vector, width) for vector in counts[first].tolist()], np.int64)
        return ids[inverse]

    def _failure_id(self, vector: list[int], width: int) -> int:
        key = (width, *vector)
        found = self._failure_ids.get(key)
        if found is None:
            reasons = {REASONS[code - 1]: gpus for code, gpus in enumerate(vector) if code and gpus}
            found = self._failure_ids[key] = len(self._failures)
            self._failures.append(FitFailure.of(reasons, width))
        return found

    # ---- scores ---------------------------------------------------------------------------------

    def _scores(self, before: _State, gpus: GpuArrays, adds: np.ndarray,
                candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The node scorer's score of each node after the container's GPUs are chosen, and that choice."""
        loads_after = before.loads + adds
        free_after = free_shares(loads_after, gpus)
        used_after = used_fractions(loads_after, gpus)
        cpu_after = before.cpu_free - self.request.cpu_milli
        measure = None if self._tasks is None else _Measure.of(self._tasks, before, gpus, cpu_after, free_after)
        each = None  # the node's measure after each GPU alone takes the slice
        if measure is not None and self.gpu_kind in ("fragmentation", "fgd"):
            each = measure.tasks.expected_each(measure.free, free_after.astype(measure.free.dtype), measure.access,
                                               measure.below_after, measure.parts)
        gpu_scores = self._gpu_scores(used_after, measure, each)
        chosen, best = _choose(np.where(candidates, gpu_scores, -np.inf), self.gpus)
        if self.node_kind in ("binpack", "spread"):
            used = node_used_fractions(np.where(chosen, used_after, used_fractions(before.loads, gpus)), gpus.healthy)
            return (used if self.node_kind == "binpack" else 1.0 - used), chosen
        free_final = before.free + chosen * (free_after - before.free)
        free_left = free_final.sum(axis=0)
        if self.node_kind == "bestfit":
            return bestfit_scores(packings(cpu_after, before.cpu_tracked, free_left, self.ctx)), chosen
        growth = np.zeros(len(free_left))
        if measure is not None:
            if each is not None and self.gpus == 1:
                final = each[best, np.arange(len(best))]
            else:
                final = measure.tasks.expected(free_final.astype(measure.free.dtype), measure.access,
                                               measure.below_after)[0]
            growth = final - measure.before
        if self.node_kind == "fgd":
            return fgd_scores(growth), chosen
        if measure is not None:
            tasks, tracked = measure.tasks, before.cpu_tracked
            growth = growth + (tasks.stranded(free_left, cpu_after, tracked)
                               - tasks.stranded(before.free.sum(axis=0), before.cpu_free, tracked))
        return fragmentation_scores(growth, packings(cpu_after, before.cpu_tracked, free_left, self.ctx)), chosen

    def _gpu_scores(self, used_after: np.ndarray, measure: _Measure | None, each: np.ndarray | None) -> np.ndarray:
        kind = self.gpu_kind
        if kind == "spread":
            return -used_after
        if kind == "fragmentation" and each is not None:
            return -each + 1e-6 * used_after
        if kind == "fgd":
            return fgd_scores(each - measure.before if each is not None else np.zeros(used_after.shape))
        return used_after  # binpack, topology-aware for one GPU, fragmentation-aware without a model


@dataclass(frozen=True, slots=True)
class _Measure:
    """The fragmentation measure of the nodes before the pod, with what the after-states reuse."""

    tasks: TaskArrays
    free: np.ndarray
    """The free shares before, int32 where every share is in [-10**6, 1000] (the per-task temporaries
    are then half the size; sums over a node stay far from int32's bounds), int64 otherwise."""
    access: np.ndarray | None
    below_after: np.ndarray
    before: np.ndarray
    parts: tuple

    @classmethod
    def of(cls, tasks: TaskArrays, before: _State, gpus: GpuArrays, cpu_after: np.ndarray,
           free_after: np.ndarray) -> _Measure:
        narrow = len(before.free) <= 1000 and all(
            array.size == 0 or (array.min() >= -10**6 and array.max() <= 1000) for array in (before.free, free_after))
        free = before.free.astype(np.int32) if narrow else before.free
        access = tasks.access_of(gpus.product)
        value, parts = tasks.expected(free, access, tasks.cpu_below(before.cpu_free, before.cpu_tracked))
        return cls(tasks, free, access, tasks.cpu_below(cpu_after, before.cpu_tracked), value, parts)


def _reason_codes(loads: np.ndarray, table: ShapeTable, needs: _Needs, shape: np.ndarray) -> np.ndarray:
    """fit.py's first failing reason per GPU, as its code (0: the GPU takes the need): each check,
    last to first, overwrites the code where it fails, so the first failing one is what is left."""
    memory_held, slices, cu_held, whole = loads
    pin = needs.pin_cus[:, shape]
    code = CORES * ((needs.reserves_all[:, shape] & (cu_held != 0))
                    | ((pin != 0) & (table.cu_usable[:, shape] - cu_held < pin)))
    for failing, reason in ((memory_held + needs.memory_mib[:, shape] > table.memory_mib[:, shape], MEMORY),
                            (slices >= table.max_slices[:, shape], SLICES),
                            ((whole != 0) | (needs.whole[:, shape] & (slices != 0)), EXCLUSIVE)):
        code += failing * (reason - code)
    barred = needs.barred[:, shape]
    return code + (barred != 0) * (barred - code)


def _distinct_rows(counts: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(a row index of each distinct row, each row's distinct index): rows of small counts packed
    into one integer each where they fit in 62 bits, else compared whole."""
    used = np.flatnonzero(counts.any(axis=0))
    if base ** len(used) < 1 << 62:
        packed = counts[:, used] @ (base ** np.arange(len(used), dtype=np.int64))
        _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(counts, axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _choose(scores: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(GPUs, nodes) mask of the `count` best scores of each node, the lowest position first on
    ties (argmax takes the first maximum), and the best position of each; non-candidates score -inf."""
    chosen = np.zeros(scores.shape, bool)
    every = np.arange(scores.shape[1])
    best = first = np.argmax(scores, axis=0)
    chosen[best, every] = True
    if count > 1:
        scores = scores.copy()
        for _ in range(count - 1):
            scores[best, every] = -np.inf
            best = np.argmax(scores, axis=0)
            chosen[best, every] = True
    return chosen, first


def _grown_needs(old: _Needs | None, shapes: int, width: int) -> _Needs:
    """`old` with room for `shapes` shapes (new columns unfilled)."""
    def grown(name: str, dtype, *head: int) -> np.ndarray:
        new = np.zeros((*head, width, shapes), dtype)
        if old is not None:
            array = getattr(old, name)
            new[..., :array.shape[-1]] = array
        return new

    known = np.zeros(shapes, bool)
    if old is not None:
        known[:len(old.known)] = old.known
    return _Needs(grown("memory_mib", np.int64), grown("pin_cus", np.int64), grown("whole", bool),
                  grown("reserves_all", bool), grown("adds", np.int64, 4), grown("barred", np.int64), known)
