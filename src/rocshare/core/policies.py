"""Placement policies: registries of named scoring functions behind string enums.

Two registries, as scheduler-plugins does it: ``GPU_SCORERS`` rank one GPU for one need
(used to choose which GPUs of a node a container gets) and ``NODE_SCORERS`` rank a node
from its load before and after the pod (the extender's prioritize). Scores are floats,
higher is better; ``normalize_scores`` maps them to the extender's 0-10 as a separate step.
A node scorer may bring its own GPU scorer (``PAIRED_GPU_SCORERS``: the paper's FGD picks
the GPU by the same integer score as the node); ``gpu_scorer_for`` resolves it.

Every score reads every request term through the GPU load (memory MiB, slices, CUs held)
and compares each with its own capacity: memory with memory, CUs with CUs (fractions of
the GPU), never a CU count against a percent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from rocshare.api.models import GpuPolicy, NodePolicy, Scheduling
from rocshare.core.fit import Load
from rocshare.core.fragmentation import MILLI, FragmentationModel
from rocshare.core.headroom import free_share_milli
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.request import PodRequest

MAX_EXTENDER_SCORE = 10


class NodeScorer(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    BESTFIT = "bestfit"
    """The FGD paper's BestFit baseline (its integer 0-100 score, CPU and GPU left)."""
    FGD = "fgd"
    """The FGD paper's node score: minus the growth of expected fragmentation."""
    FRAGMENTATION = "fragmentation"
    """Ours: FGD's growth plus CPU-stranded GPU growth, ties to the tighter-packed node."""


_NODE_SCORER_OF = {NodePolicy.BINPACK: NodeScorer.BINPACK, NodePolicy.SPREAD: NodeScorer.SPREAD,
                   NodePolicy.BESTFIT: NodeScorer.BESTFIT}
"""A pool's (or pod annotation's) node policy -> its node scorer."""


@dataclass(frozen=True, slots=True)
class Policy:
    node: NodeScorer = NodeScorer.BINPACK
    gpu: GpuPolicy = GpuPolicy.BINPACK

    @classmethod
    def resolve(cls, defaults: Scheduling, request: PodRequest) -> Policy:
        """Pod annotations override the pool's defaults; a fragmentation-aware GPU policy
        implies fragmentation-aware node scoring (the measure is per node)."""
        gpu = request.gpu_policy or defaults.gpu_policy
        if gpu == GpuPolicy.FRAGMENTATION_AWARE:
            return cls(NodeScorer.FRAGMENTATION, gpu)
        node = request.node_policy or defaults.node_policy
        return cls(_NODE_SCORER_OF[node], gpu)


@dataclass(frozen=True, slots=True)
class ScoringContext:
    """Cluster-wide inputs some scorers need; built once by the caller."""

    fragmentation: FragmentationModel | None = None
    cpu_norm_milli: int = 128_000
    """BestFit's CPU normaliser: the largest node's CPU (the paper: 128 cores)."""
    gpu_norm_milli: int = 8 * MILLI
    """BestFit's GPU normaliser: the largest node's GPUs x 1000."""


class NodeView(NamedTuple):
    """One node for a scorer: loads before/after the pod, host CPU free after (None = untracked).
    A named tuple, immutable like the rest: one is built per candidate GPU of every node planned.

    ``free_before`` and ``free_after``: each GPU's free share (rocshare.core.headroom) under
    ``before`` and ``after``, when the caller keeps them (the ledger keeps the first with the usage,
    the planner the second in step with its loads); empty = worked out here from the loads."""

    node: NodeInventory
    before: tuple[Load, ...]
    after: tuple[Load, ...]
    cpu_free_before: int | None
    cpu_free_after: int | None
    free_before: tuple[int, ...] = ()
    free_after: tuple[int, ...] = ()


# ---- GPU scorers ---------------------------------------------------------------------------


def used_fraction(spec: GpuSpec, load: Load) -> float:
    """Mean of the memory and CU fractions held: both dimensions, each against its own total."""
    memory = load[0] / spec.memory_mib if spec.memory_mib else 1.0
    cores = load[2] / spec.cu_count if spec.cu_count else 1.0
    return (memory + cores) / 2


GpuScorer = Callable[[NodeView, int, ScoringContext], float]
"""(node with the GPU's load after in ``after``, GPU position, context) -> score. A GPU scorer
reads the GPU through its spec's numbers and its load, and the node as a whole, never the
position itself: twins (NodeInventory.twins) under equal loads score alike, and planners score
them once (choose.py breaks ties by the lowest position)."""


def gpu_binpack(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    return used_fraction(view.node.gpus[pos], view.after[pos])


def gpu_spread(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    return -used_fraction(view.node.gpus[pos], view.after[pos])


def gpu_fragmentation(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    if ctx.fragmentation is None:
        return gpu_binpack(view, pos, ctx)
    frag = ctx.fragmentation.node_fragmentation(view.node, view.after, view.cpu_free_after, view.free_after or None)
    # Equal growth: prefer the fuller GPU (best fit), which keeps larger holes elsewhere.
    return -frag + 1e-6 * gpu_binpack(view, pos, ctx)


GPU_SCORERS: dict[GpuPolicy, GpuScorer] = {
    GpuPolicy.BINPACK: gpu_binpack,
    GpuPolicy.SPREAD: gpu_spread,
    GpuPolicy.TOPOLOGY_AWARE: gpu_binpack,  # per GPU; the set bonus is in choose.py
    GpuPolicy.FRAGMENTATION_AWARE: gpu_fragmentation,
}


# ---- node scorers --------------------------------------------------------------------------


NodeScoreFn = Callable[[NodeView, PodRequest, ScoringContext], float]


def node_used_fraction(node: NodeInventory, loads: tuple[Load, ...]) -> float:
    """Mean used_fraction over the node's healthy GPUs (0 when none is healthy)."""
    total, healthy = 0.0, 0
    for spec, load in zip(node.gpus, loads):
        if spec.healthy:
            total += used_fraction(spec, load)
            healthy += 1
    return total / healthy if healthy else 0.0


def node_binpack(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return node_used_fraction(view.node, view.after)


def node_spread(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return 1.0 - node_used_fraction(view.node, view.after)


def free_share_total(node: NodeInventory, loads: tuple[Load, ...]) -> int:
    return sum(free_share_milli(spec, load) for spec, load in zip(node.gpus, loads))


def free_totals(view: NodeView) -> tuple[int, int]:
    """The node's free share before and after the pod (milli)."""
    before = sum(view.free_before) if view.free_before else free_share_total(view.node, view.before)
    after = sum(view.free_after) if view.free_after else free_share_total(view.node, view.after)
    return before, after


def packing(view: NodeView, ctx: ScoringContext, gpu_left: int | None = None) -> float:
    """The paper's BestFit as a fraction in [0, 1]: 1 - half the CPU left - half the GPU left,
    each against the largest node's (so the fuller node, in both dimensions, scores higher).
    ``gpu_left``: the free share after, when the caller has it."""
    cpu_left = view.cpu_free_after or 0
    if gpu_left is None:
        gpu_left = free_share_total(view.node, view.after)
    return 1.0 - 0.5 * cpu_left / ctx.cpu_norm_milli - 0.5 * gpu_left / ctx.gpu_norm_milli


def node_bestfit(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return float(int(packing(view, ctx) * 100))  # the paper's integer score: ties are real


def _fragmentation_growth(view: NodeView, ctx: ScoringContext) -> float:
    model = ctx.fragmentation
    if model is None:
        return 0.0
    before = model.node_fragmentation(view.node, view.before, view.cpu_free_before, view.free_before or None)
    after = model.node_fragmentation(view.node, view.after, view.cpu_free_after, view.free_after or None)
    return after - before


def _stranding_growth(view: NodeView, ctx: ScoringContext, free: tuple[int, int]) -> float:
    """``free``: the node's free share before and after (`free_totals`)."""
    model = ctx.fragmentation
    if model is None:
        return 0.0
    before = model.stranded_milli(free[0], view.cpu_free_before)
    after = model.stranded_milli(free[1], view.cpu_free_after)
    return after - before


def fgd_score(growth_milli: float) -> float:
    """The paper's score: ``int(100 * sigmoid(-growth / 1000))``, growth in GPU-milli. An
    integer on purpose: equal scores are ties, broken by the scheduler (the paper's simulator:
    the first node in a fixed order) and by the lowest index across GPUs."""
    return float(int(100.0 / (1.0 + math.exp(growth_milli / MILLI))))


def node_fgd(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return fgd_score(_fragmentation_growth(view, ctx))


def gpu_fgd(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    return fgd_score(_fragmentation_growth(view, ctx))


GROWTH_STEP_MILLI = 100
"""Growth differences inside one step (a tenth of a GPU) count as equal; packing decides."""
PACKING_WEIGHT = 1e-3
"""Keeps packing (in [0, 1]) below one growth step: it only ever breaks ties."""


def node_fragmentation(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    """Ours: FGD's growth plus the growth of CPU-stranded GPU share, in steps of a tenth of a
    GPU, ties to the node BestFit packs tighter. Explicit tie-breaks: the result does not hinge
    on how the scheduler breaks ties (kube-scheduler: at random), and without a fragmentation
    model (growth 0) it is plain BestFit packing."""
    free = free_totals(view)
    growth = _fragmentation_growth(view, ctx) + _stranding_growth(view, ctx, free)
    return math.floor(-growth / GROWTH_STEP_MILLI) + PACKING_WEIGHT * packing(view, ctx, free[1])


NODE_SCORERS: dict[NodeScorer, NodeScoreFn] = {
    NodeScorer.BINPACK: node_binpack,
    NodeScorer.SPREAD: node_spread,
    NodeScorer.BESTFIT: node_bestfit,
    NodeScorer.FGD: node_fgd,
    NodeScorer.FRAGMENTATION: node_fragmentation,
}


PAIRED_GPU_SCORERS: dict[tuple[NodeScorer, GpuPolicy], GpuScorer] = {
    # The paper's FGD picks the GPU by the same integer score as the node (lowest index on ties).
    (NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE): gpu_fgd,
}


HEADROOM_NODE_SCORERS = frozenset({NodeScorer.BESTFIT, NodeScorer.FGD, NodeScorer.FRAGMENTATION})
"""Node scorers that read the GPUs' free shares (packing, fragmentation, stranding)."""


def reads_headroom(policy: Policy) -> bool:
    """Whether the policy's scores read free shares: then a planner hands them in each NodeView."""
    return policy.node in HEADROOM_NODE_SCORERS or policy.gpu == GpuPolicy.FRAGMENTATION_AWARE


def gpu_scorer_for(policy: Policy) -> GpuScorer:
    """The GPU scorer of a policy: its GPU policy's, unless the node scorer brings its own."""
    return PAIRED_GPU_SCORERS.get((policy.node, policy.gpu)) or GPU_SCORERS[policy.gpu]


def normalize_scores(scores: Mapping[str, float]) -> dict[str, int]:
    """Min-max to the extender's 0-10 (integers): `score_levels` applied to each node."""
    level = score_levels(scores.values())
    return {name: level[value] for name, value in scores.items()}


def score_levels(raw_scores: Iterable[float]) -> dict[float, int]:
    """Each distinct raw score -> its 0-10 level (integers). All equal -> all 0 (no preference).

    Only the best raw score gets 10; every other at most 9. Rounding alone would put nodes a hair
    below the best into the top bucket too, and kube-scheduler would pick among them at random;
    this way its pick is the policy's best (or one of exactly equal ones) whenever the extender's
    weight outweighs its own scores (manifests/base/scheduler). Halves round up. Nodes share raw
    scores (nodes alike, equal loads): each distinct value is scaled once."""
    values = set(raw_scores)
    if not values:
        return {}
    low, high = min(values), max(values)
    if high == low:
        return {high: 0}
    scale = MAX_EXTENDER_SCORE / (high - low)
    # round half up; scores nearly all differ (fragmentation-aware), so this runs per node: kept plain
    level = {value: int((value - low) * scale + 0.5) for value in values}
    below = MAX_EXTENDER_SCORE - 1
    for value in [value for value, points in level.items() if points > below]:
        level[value] = below
    level[high] = MAX_EXTENDER_SCORE
    return level
