"""Quota in consistent units, score normalisation, policy resolution, the typical workload."""

from __future__ import annotations

from rocshare.api.models import GpuPolicy, OmittedCores, Scheduling, ShareLimits, ShareUsage
from rocshare.core.fit import Reason
from rocshare.core.fragmentation import FragmentationModel, TypicalTask, TypicalWorkload
from rocshare.core.policies import NodeScorer, Policy, normalize_scores
from rocshare.core.holdings import request_cost
from rocshare.core.quota import check_quota
from rocshare.core.request import parse_pod

from .helpers import gpu, node, pod


def test_quota_cost_units():
    request = parse_pod(pod({"amd.com/gpu": 2, "amd.com/gpumem": 1000, "amd.com/gpucores": 30},
                            {"amd.com/gpu": 1}, {"amd.com/gpumem-percentage": 50}))
    cost = request_cost(request, gpu_memory_mib=8000, omitted=OmittedCores.EXCLUSIVE)
    # memory: 2x1000 + 8000 (whole) + 4000 (50 %); cores: 2x30 + 100 (whole) + 100 (omitted, Exclusive)
    assert (cost.memory_mib, cost.cores_pct, cost.gpus) == (14000, 260, 4)
    shared = request_cost(parse_pod(pod({"amd.com/gpumem": 10})), gpu_memory_mib=8000, omitted=OmittedCores.SHARED)
    assert shared.cores_pct == 0


def test_quota_check():
    cost = request_cost(parse_pod(pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 50})), gpu_memory_mib=8000,
                        omitted=OmittedCores.EXCLUSIVE)
    assert check_quota(cost, ShareLimits(memoryMiB=2000, coresPercent=250), ShareUsage(memoryMiB=1000, coresPercent=200)) is None
    verdict = check_quota(cost, ShareLimits(memoryMiB=1500, coresPercent=220), ShareUsage(memoryMiB=1000, coresPercent=200))
    assert verdict.reason == Reason.RESOURCE_QUOTA_NOT_FIT
    assert "memory MiB: 1000 used + 1000 asked > 1500 limit" in verdict.message and "cores %" in verdict.message


def test_normalize_scores():
    assert normalize_scores({"a": 1.0, "b": 3.0, "c": 2.0}) == {"a": 0, "b": 10, "c": 5}
    assert normalize_scores({"a": 1.0, "b": 1.0}) == {"a": 0, "b": 0}
    assert normalize_scores({}) == {}


def test_policy_resolution():
    request = parse_pod(pod({"amd.com/gpu": 1}, annotations={"hami.io/node-scheduler-policy": "spread"}))
    assert Policy.resolve(Scheduling(), request) == Policy(NodeScorer.SPREAD, GpuPolicy.BINPACK)
    frag = parse_pod(pod({"amd.com/gpu": 1}, annotations={"hami.io/gpu-scheduler-policy": "fragmentation-aware"}))
    assert Policy.resolve(Scheduling(), frag).node == NodeScorer.FRAGMENTATION


def test_typical_workload_keeps_most_frequent_until_coverage():
    samples = [(1000, 1, 500, ())] * 90 + [(2000, 1, 1000, ())] * 8 + [(0, 0, 0, ())] * 2
    workload = TypicalWorkload.from_samples(samples, coverage=0.95)
    assert [(t.share_milli, round(t.weight, 3)) for t in workload.tasks] == [(500, 0.918), (1000, 0.082)]


def test_fragmentation_counts_too_small_gpus():
    model = FragmentationModel(TypicalWorkload((TypicalTask(0, 1, 500),)))
    inv = node(gpu(0, memory_mib=1000, cu_count=100), gpu(1, memory_mib=1000, cu_count=100))
    assert model.node_fragmentation(inv, ((0, 0, 0, 0), (0, 0, 0, 0))) == 0.0
    # GPU 0 keeps 300 milli free: too small for a 500-milli task -> 300 fragmented
    assert model.node_fragmentation(inv, ((700, 1, 70, 0), (0, 0, 0, 0))) == 300.0
    # no GPU can host the task -> every free milli is fragmented
    assert model.node_fragmentation(inv, ((700, 1, 70, 0), (600, 1, 60, 0))) == 700.0
