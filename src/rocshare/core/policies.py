"""Placement policies: registries of named scoring functions behind string enums.

Two registries, as scheduler-plugins does it: ``GPU_SCORERS`` rank one GPU for one need
(used to choose which GPUs of a node a container gets) and ``NODE_SCORERS`` rank a node
from its load before and after the pod (the extender's prioritize). Scores are floats,
higher is better; ``normalize_scores`` maps them to the extender's 0-10 as a separate step.

Every score reads every request term through the GPU load (memory MiB, slices, CUs held)
and compares each with its own capacity: memory with memory, CUs with CUs (fractions of
the GPU), never a CU count against a percent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rocshare.api.models import GpuPolicy, NodePolicy, Scheduling
from rocshare.core.fit import Load
from rocshare.core.fragmentation import MILLI, FragmentationModel, free_share_milli
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
    """Ours: FGD's growth, ties broken towards the node left with the least free GPU share."""


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
        return cls(NodeScorer.SPREAD if node == NodePolicy.SPREAD else NodeScorer.BINPACK, gpu)


@dataclass(frozen=True, slots=True)
class ScoringContext:
    """Cluster-wide inputs some scorers need; built once by the caller."""

    fragmentation: FragmentationModel | None = None
    cpu_norm_milli: int = 128_000
    """BestFit's CPU normaliser: the largest node's CPU (the paper: 128 cores)."""
    gpu_norm_milli: int = 8 * MILLI
    """BestFit's GPU normaliser: the largest node's GPUs x 1000."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node for a scorer: loads before/after the pod, host CPU free after (None = untracked)."""

    node: NodeInventory
    before: tuple[Load, ...]
    after: tuple[Load, ...]
    cpu_free_before: int | None
    cpu_free_after: int | None


# ---- GPU scorers ---------------------------------------------------------------------------


def used_fraction(spec: GpuSpec, load: Load) -> float:
    """Mean of the memory and CU fractions held: both dimensions, each against its own total."""
    memory = load[0] / spec.memory_mib if spec.memory_mib else 1.0
    cores = load[2] / spec.cu_count if spec.cu_count else 1.0
    return (memory + cores) / 2


GpuScorer = Callable[[NodeView, int, ScoringContext], float]
"""(node with the GPU's load after in ``after``, GPU position, context) -> score."""


def gpu_binpack(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    return used_fraction(view.node.gpus[pos], view.after[pos])


def gpu_spread(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    return -used_fraction(view.node.gpus[pos], view.after[pos])


def gpu_fragmentation(view: NodeView, pos: int, ctx: ScoringContext) -> float:
    if ctx.fragmentation is None:
        return gpu_binpack(view, pos, ctx)
    frag = ctx.fragmentation.node_fragmentation(view.node, view.after, view.cpu_free_after)
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
    healthy = [(spec, load) for spec, load in zip(node.gpus, loads) if spec.healthy]
    if not healthy:
        return 0.0
    return sum(used_fraction(spec, load) for spec, load in healthy) / len(healthy)


def node_binpack(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return node_used_fraction(view.node, view.after)


def node_spread(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return 1.0 - node_used_fraction(view.node, view.after)


def free_share_total(node: NodeInventory, loads: tuple[Load, ...]) -> int:
    return sum(free_share_milli(spec, load) for spec, load in zip(node.gpus, loads))


def node_bestfit(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    cpu_left = view.cpu_free_after or 0
    gpu_left = free_share_total(view.node, view.after)
    left = 0.5 * cpu_left / ctx.cpu_norm_milli + 0.5 * gpu_left / ctx.gpu_norm_milli
    return float(int((1.0 - left) * 100))  # the paper's integer score: ties are real


def _fragmentation_growth(view: NodeView, ctx: ScoringContext) -> float:
    model = ctx.fragmentation
    if model is None:
        return 0.0
    before = model.node_fragmentation(view.node, view.before, view.cpu_free_before)
    after = model.node_fragmentation(view.node, view.after, view.cpu_free_after)
    return after - before


def node_fgd(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    return -_fragmentation_growth(view, ctx)


def node_fragmentation(view: NodeView, request: PodRequest, ctx: ScoringContext) -> float:
    growth = _fragmentation_growth(view, ctx)
    # Tie-break (growth is in milli, the term below stays under 1e-3 of a milli): the node
    # left with less free GPU share, so equal-growth pods pack instead of scattering.
    left = free_share_total(view.node, view.after) / (MILLI * max(1, len(view.node.gpus)))
    return -growth - 1e-3 * left


NODE_SCORERS: dict[NodeScorer, NodeScoreFn] = {
    NodeScorer.BINPACK: node_binpack,
    NodeScorer.SPREAD: node_spread,
    NodeScorer.BESTFIT: node_bestfit,
    NodeScorer.FGD: node_fgd,
    NodeScorer.FRAGMENTATION: node_fragmentation,
}


def normalize_scores(scores: Mapping[str, float]) -> dict[str, int]:
    """Min-max to the extender's 0-10 (integers). All equal -> all 0 (no preference)."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return {name: 0 for name in scores}
    span = high - low
    return {name: int(round((value - low) * MAX_EXTENDER_SCORE / span)) for name, value in scores.items()}
