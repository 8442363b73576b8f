"""The extender's per-pool fragmentation models fed by pods: one sample per bound pod read from
its allocation record (GPU-less pods of rocshare's scheduler as CPU-only tasks), with the pod's CPU
request, pods of no pool and other schedulers' GPU-less pods left out, the pool's model in its scoring context, and
fragmentation-aware decisions scoring with it (the ScoringContext carries the pool's model)."""

from __future__ import annotations

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.core.policies import NodeScorer, Policy
from rocshare.api.models import GpuPolicy
from rocshare.core.holdings import HostRequest
from rocshare_operator.extender.workloads import PoolWorkloads, reads_model, shape_of
from rocshare_operator.feed.cluster_facts import PodFacts


def record(*devices: DeviceSlice, node: str = "n1") -> AllocationRecord:
    return AllocationRecord(node=node, containers=[ContainerAllocation(name="main", devices=list(devices))])


def slice_(cores_pct: int | None, cu_count: int = 30, whole: bool = False) -> DeviceSlice:
    return DeviceSlice(gpuId="g0", memoryMiB=1024, cuRanges=[(0, max(0, cu_count - 1))], cuCount=cu_count,
                       whole=whole, coresPct=cores_pct)


def facts(name: str, node: str, text: str | None, *, cpu_milli: int = 0,
          scheduler: str = "rocshare-scheduler") -> PodFacts:
    return PodFacts(namespace="ns", name=name, node=node, scheduler_name=scheduler, phase="Running",
                    deleting=False, unschedulable=None, started=True, allocation=text,
                    host=HostRequest(cpu_milli, 0))


def test_shapes_from_records() -> None:
    assert shape_of(record(slice_(47)), {}) == (0, 1, 470, ())
    assert shape_of(record(slice_(None, cu_count=26)), {"g0": 104}) == (0, 1, 250, ())
    assert shape_of(record(slice_(None, cu_count=104, whole=True), slice_(None, cu_count=104, whole=True)), {}) == (0, 2, 1000, ())


def test_pods_are_sampled_once_per_pool() -> None:
    workloads = PoolWorkloads({"n1": "pool-a"}, lambda node: {})
    text = encode_record(record(slice_(47)))
    for _ in range(3):
        workloads.on_pod("MODIFIED", facts("p1", "n1", text))
    workloads.on_pod("ADDED", facts("p2", "n9", text))  # a node of no pool
    workloads.on_pod("ADDED", facts("p3", "", None))  # not bound yet
    workloads.on_pod("ADDED", facts("p4", "n1", None, scheduler="default-scheduler"))  # a DaemonSet's
    assert workloads.windows["pool-a"].seen == 1
    assert set(workloads.windows) == {"pool-a"}


def test_samples_carry_cpu_and_gpu_less_pods_count() -> None:
    workloads = PoolWorkloads({"n1": "pool-a"}, lambda node: {})
    workloads.on_pod("ADDED", facts("p1", "n1", encode_record(record(slice_(47))), cpu_milli=8000))
    workloads.on_pod("ADDED", facts("p2", "n1", None, cpu_milli=4000))  # bound, no record: asks no GPU
    assert sorted(workloads.windows["pool-a"]._counts) == [(4000, 0, 0, ()), (8000, 1, 470, ())]
    assert shape_of(record(slice_(47)), {}, cpu_milli=1500) == (1500, 1, 470, ())


def test_context_carries_the_pools_model() -> None:
    workloads = PoolWorkloads({"n1": "pool-a"}, lambda node: {})
    for index in range(300):
        workloads.on_pod("ADDED", facts(f"p{index}", "n1", encode_record(record(slice_(47)))))
    model = workloads.context("pool-a").fragmentation
    assert [(t.gpus, t.share_milli, t.weight) for t in model.workload.tasks] == [(1, 470, 1.0)]
    assert workloads.context("pool-a") is workloads.context("pool-a")  # built once per model
    assert workloads.context(None).fragmentation is not model  # no pool: the prior


def test_which_policies_read_a_model() -> None:
    assert reads_model(Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE))
    assert reads_model(Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE))
    assert not reads_model(Policy(NodeScorer.BINPACK, GpuPolicy.BINPACK))
