"""The FGD measure per task type, CPU stranding, the paper's FGD score and GPU choice, and our
fragmentation-aware node score (growth steps, packing tie-break) -- table tests."""

from __future__ import annotations

import pytest

from rocshare.api.models import GpuPolicy
from rocshare.core.allocate import plan_pod
from rocshare.core.fragmentation import FragmentationModel, TypicalTask, TypicalWorkload
from rocshare.core.ids import NodeName
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import GpuUsage, NodeUsage
from rocshare.core.policies import (
    GPU_SCORERS, NodeScorer, NodeView, Policy, ScoringContext, fgd_score, gpu_fgd, gpu_scorer_for, node_fragmentation,
)
from rocshare.core.request import ContainerRequest, PodRequest, Selection

from .helpers import gpu

FREE = (0, 0, 0, 0)
WHOLE = (1000, 1, 100, 1)


def held(milli: int) -> tuple[int, int, int, int]:
    """The load of one slice of ``milli`` thousandths on a 1000 MiB / 100 CU GPU."""
    return (milli, 1, milli // 10, 0)


def inventory(*products: str, cpu_milli: int = 0, memory_mib: int = 0, name: str = "n1") -> NodeInventory:
    gpus = tuple(gpu(i, memory_mib=1000, cu_count=100, product=p, node=name) for i, p in enumerate(products))
    return NodeInventory(NodeName(name), gpus, cpu_milli=cpu_milli, memory_mib=memory_mib)


def model(*tasks: TypicalTask) -> FragmentationModel:
    return FragmentationModel(TypicalWorkload(tasks))


SHARE_500 = TypicalTask(1000, 1, 500)
TWO_WHOLE = TypicalTask(1000, 2, 1000)
CPU_ONLY = TypicalTask(4000, 0, 0)
T4_ONLY = TypicalTask(0, 1, 500, ("t4",))


@pytest.mark.parametrize(
    ("task", "loads", "cpu_free", "fragmented"),
    [
        # a sharing task: GPUs with less than its share free are fragments
        (SHARE_500, (FREE, FREE), 8000, 0),
        (SHARE_500, (held(700), FREE), 8000, 300),
        (SHARE_500, (held(700), held(600)), 8000, 700),  # no GPU can host it: all free
        # a whole multi-GPU task: needs that many fully free GPUs
        (TWO_WHOLE, (FREE, FREE, held(500)), 8000, 500),
        (TWO_WHOLE, (FREE, held(100), held(500)), 8000, 2400),
        (TWO_WHOLE, (FREE, FREE, WHOLE), 8000, 0),
        # CPU-bound: the node cannot host the task at all, so all its free share is fragment
        (SHARE_500, (FREE, FREE), 999, 2000),
        (SHARE_500, (FREE, FREE), None, 0),  # CPU untracked: always fits
        # a CPU-only task can use none of the free GPU, fitting or not
        (CPU_ONLY, (FREE, held(700)), 8000, 1300),
        (CPU_ONLY, (FREE, held(700)), 1000, 1300),
        # a model constraint the node does not meet
        (T4_ONLY, (FREE, FREE), 8000, 2000),
    ],
)
def test_fragmentation_per_task_type(task, loads, cpu_free, fragmented):
    inv = inventory(*(["MI210"] * len(loads)), cpu_milli=16000)
    assert model(task).node_fragmentation(inv, loads, cpu_free) == fragmented


def test_model_constraint_is_per_gpu_product():
    inv = inventory("T4", "MI210", cpu_milli=16000)
    # only the T4 can host the task; the MI210's free share is a fragment for it
    assert model(T4_ONLY).node_fragmentation(inv, (FREE, FREE), 8000) == 1000


def test_expected_fragmentation_is_the_weighted_sum():
    tasks = (TypicalTask(0, 1, 500, weight=0.75), TypicalTask(0, 0, 0, weight=0.25))
    inv = inventory("MI210", "MI210", cpu_milli=16000)
    # share task: 300 fragmented; CPU-only task: all 1300 -> 0.75*300 + 0.25*1300
    assert model(*tasks).node_fragmentation(inv, (held(700), FREE), 8000) == pytest.approx(550.0)


@pytest.mark.parametrize(
    ("tasks", "ratio"),
    [
        ((TypicalTask(10_000, 1, 1000, weight=1.0),), 0.1),
        ((TypicalTask(10_000, 1, 1000, weight=0.5), TypicalTask(5_000, 1, 500, weight=0.5)), 0.1),
        ((TypicalTask(4_000, 2, 1000, weight=0.5), TypicalTask(32_000, 0, 0, weight=0.5)), 0.5),  # CPU-only ignored
        ((TypicalTask(0, 1, 500, weight=1.0),), 0.0),  # no GPU task asks CPU: no stranding
    ],
)
def test_gpu_per_cpu_ratio_of_the_typical_workload(tasks, ratio):
    assert TypicalWorkload(tasks).gpu_milli_per_cpu_milli == pytest.approx(ratio)


@pytest.mark.parametrize(
    ("free", "cpu_free", "stranded"),
    [(2000, 20_000, 0.0), (2000, 10_000, 1000.0), (2000, 0, 2000.0), (0, 0, 0.0), (2000, None, 0.0)],
)
def test_stranded_share_is_free_gpu_beyond_what_free_cpu_feeds(free, cpu_free, stranded):
    typical = model(TypicalTask(10_000, 1, 1000))  # 1000 GPU-milli per 10 cores
    assert typical.stranded_milli(free, cpu_free) == stranded


@pytest.mark.parametrize(
    ("growth", "score"),
    [(0, 50), (-30, 50), (30, 49), (-1000, 73), (1000, 26), (-5000, 99), (5000, 0)],
)
def test_fgd_score_is_the_papers_integer_sigmoid(growth, score):
    assert fgd_score(growth) == score


def share_request(pct: int, *, cpu_milli: int = 1000) -> PodRequest:
    container = ContainerRequest("main", False, 1, memory_pct=pct, cores_pct=pct)
    return PodRequest("ns", "p", (container,), Selection(), cpu_milli=cpu_milli, memory_mib=0)


def usage(loads, cpu_milli: int = 0) -> NodeUsage:
    gpus = tuple(GpuUsage(memory_mib=m, slices=s, cu_mask=(1 << cus) - 1, whole=w) for m, s, cus, w in loads)
    return NodeUsage(gpus, cpu_milli=cpu_milli)


def test_paired_gpu_scorer_for_the_papers_fgd():
    assert gpu_scorer_for(Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE)) is gpu_fgd
    ours = Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE)
    assert gpu_scorer_for(ours) is GPU_SCORERS[GpuPolicy.FRAGMENTATION_AWARE]


@pytest.mark.parametrize(
    ("loads", "chosen"),
    [
        # whole-GPU typical tasks: a 500 slice on GPU 1 removes its 500 fragment (growth -500),
        # anywhere else it makes one (growth +500)
        ((FREE, held(500), FREE), 1),
        # equal scores everywhere: the lowest index, as the paper's simulator
        ((FREE, FREE, FREE), 0),
    ],
)
def test_papers_fgd_chooses_the_gpu_of_least_growth(loads, chosen):
    inv = inventory("MI210", "MI210", "MI210", cpu_milli=16000, memory_mib=0)
    ctx = ScoringContext(fragmentation=model(TypicalTask(1000, 1, 1000)), cpu_norm_milli=16000, gpu_norm_milli=3000)
    plan = plan_pod(inv, usage(loads), share_request(50), Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE), ctx)
    assert plan.containers[0][0].position == chosen


def view(inv: NodeInventory, before, after, cpu_before: int, cpu_after: int) -> NodeView:
    return NodeView(inv, tuple(before), tuple(after), cpu_before, cpu_after)


def test_ours_prefers_the_node_whose_free_cpu_can_still_feed_its_gpus():
    typical = model(TypicalTask(10_000, 1, 1000))
    ctx = ScoringContext(fragmentation=typical, cpu_norm_milli=128_000, gpu_norm_milli=8000)
    request = share_request(0, cpu_milli=8000)
    lean = inventory("MI210", "MI210", cpu_milli=24_000)  # 12 cores for 2 GPUs: after 8, 4 left
    rich = inventory("MI210", "MI210", cpu_milli=104_000, name="n2")
    lean_score = node_fragmentation(view(lean, (FREE, FREE), (FREE, FREE), 24_000, 16_000), request, ctx)
    rich_score = node_fragmentation(view(rich, (FREE, FREE), (FREE, FREE), 104_000, 96_000), request, ctx)
    assert rich_score > lean_score


def test_ours_breaks_equal_growth_towards_the_tighter_packed_node():
    typical = model(TypicalTask(0, 1, 100))  # everything fits: growth is 0 on both nodes
    ctx = ScoringContext(fragmentation=typical, cpu_norm_milli=16_000, gpu_norm_milli=2000)
    inv = inventory("MI210", "MI210", cpu_milli=16_000)
    fuller = node_fragmentation(view(inv, (held(500), FREE), (held(600), FREE), 8000, 7000), share_request(10), ctx)
    emptier = node_fragmentation(view(inv, (FREE, FREE), (held(100), FREE), 8000, 7000), share_request(10), ctx)
    assert fuller > emptier and int(fuller) == int(emptier)  # same growth step, packing decides


def test_ours_without_a_model_is_plain_packing():
    inv = inventory("MI210", "MI210", cpu_milli=16_000)
    ctx = ScoringContext()
    fuller = node_fragmentation(view(inv, (held(500), FREE), (held(600), FREE), 8000, 7000), share_request(10), ctx)
    emptier = node_fragmentation(view(inv, (FREE, FREE), (held(100), FREE), 8000, 7000), share_request(10), ctx)
    assert 0 < emptier < fuller < 1e-3
