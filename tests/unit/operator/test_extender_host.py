"""Host CPU and memory in the extender, as the simulator counts them: node allocatable CPU and
memory in its inventories, every bound pod's requests in its ledger (GPU pods with their record,
GPU-less pods of any scheduler alone), host fit in filter, scores reading the CPU left, pods that
ask no GPU ranked and bound by the extender (the profile sends it every pod asking CPU), and the
pool policy `bestfit`."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.models import API_VERSION, NodePolicy, Scheduling
from rocshare.api.node_settings import POOL_LABEL
from rocshare.core.holdings import HostRequest
from rocshare.core.policies import NodeScorer, Policy
from rocshare.core.request import ContainerRequest, PodRequest
from rocshare.core.workload import WorkloadWindow
from rocshare_operator.extender.binder import Binder
from rocshare_operator.extender.decisions import NO_INVENTORY, filter_nodes, prioritize
from rocshare_operator.extender.state import SchedulerState

from .test_binder import OnePodServer

NAMESPACE = "team"


def gpu(node: str, index: int) -> dict:
    return {"id": f"GPU-{node}-{index}", "index": index, "gfxTargetVersion": 90010, "cuCount": 100, "vramMiB": 16000,
            "pciBDF": f"0000:0{index + 1}:00.0", "splitCount": 10, "healthy": True}


def add_node(state: SchedulerState, name: str, *, cpu: str = "16", memory: str = "64Gi", gpus: int = 2) -> None:
    state.on_node("ADDED", {"metadata": {"name": name, "labels": {POOL_LABEL: "p"}},
                            "status": {"allocatable": {"amd.com/gpu": str(gpus), "cpu": cpu, "memory": memory}}})
    state.on_gpu_node("MODIFIED", {"metadata": {"name": name}, "status": {"gpus": [gpu(name, i) for i in range(gpus)]}})


def set_pool(state: SchedulerState, **scheduling: str) -> None:
    state.on_pool("MODIFIED", {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "p"},
                               "spec": {"nodeSelector": {POOL_LABEL: "p"}, "scheduling": scheduling}})


def pod_object(name: str, *, node: str = "", cpu: str = "1", gpus: int = 0, scheduler: str = "rocshare-scheduler",
               phase: str = "Running") -> dict:
    limits = {"amd.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "resourceVersion": "5"},
            "spec": {"nodeName": node, "schedulerName": scheduler,
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                                                "limits": limits}}]},
            "status": {"phase": phase}}


def request(name: str = "new", *, cpu_milli: int = 1000, gpus: int = 1) -> PodRequest:
    containers = (ContainerRequest("c", False, gpus),) if gpus else ()
    return PodRequest(NAMESPACE, name, containers, cpu_milli=cpu_milli, memory_mib=1024)


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    set_pool(state, gpuPolicy="fragmentation-aware")
    add_node(state, "n1")
    add_node(state, "n2")
    return state


def test_inventories_carry_the_nodes_allocatable_cpu_and_memory(state: SchedulerState) -> None:
    add_node(state, "n3", cpu="15500m", memory="1e9")
    node = state.inventories["n3"]
    assert (node.cpu_milli, node.memory_mib) == (15500, 953)  # memory offered: rounded down


async def test_bound_gpu_less_pods_of_any_scheduler_hold_their_cpu_until_they_end(state: SchedulerState) -> None:
    await state.on_pod("ADDED", pod_object("web", node="n1", cpu="3", scheduler="default-scheduler"))
    await state.on_pod("ADDED", pod_object("waiting", cpu="5"))  # not bound: holds nothing
    usage = state.ledger.usage(state.inventories["n1"])
    assert (usage.cpu_milli, usage.memory_mib) == (3000, 1024)
    await state.on_pod("MODIFIED", pod_object("web", node="n1", cpu="3", phase="Succeeded"))
    assert state.ledger.usage(state.inventories["n1"]).cpu_milli == 0 and "team/web" not in state.ledger


async def test_a_gpu_pods_record_is_applied_with_its_cpu(state: SchedulerState) -> None:
    server = OnePodServer(pod_object("train", cpu="6", gpus=1))
    record = await Binder(server, state).bind(NAMESPACE, "train", "uid-train", "n1")
    assert server.pod["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    assert record is not None and state.ledger.usage(state.inventories["n1"]).cpu_milli == 6000
    bound = server.pod  # the watch echoes the bound pod: counted once
    await state.on_pod("MODIFIED", bound)
    assert state.ledger.usage(state.inventories["n1"]).cpu_milli == 6000


async def test_filter_checks_cpu_where_it_knows_the_node(state: SchedulerState) -> None:
    await state.on_pod("ADDED", pod_object("big", node="n1", cpu="15"))
    result = filter_nodes(state.snapshot(), request(cpu_milli=2000), ["n1", "n2"])
    assert result.feasible == ["n2"] and "NodeInsufficientCPU" in result.failed["n1"].text()


def test_a_pod_asking_no_gpu_may_go_to_nodes_the_extender_does_not_know(state: SchedulerState) -> None:
    gpu_less = request(gpus=0)
    assert filter_nodes(state.snapshot(), gpu_less, ["n1", "cpu-only"]).feasible == ["n1", "cpu-only"]
    gpu_pod = filter_nodes(state.snapshot(), request(), ["n1", "cpu-only"])
    assert gpu_pod.failed["cpu-only"].reasons == ((NO_INVENTORY, 0),)
    scores = prioritize(state.snapshot(), gpu_less, ["n1", "cpu-only"]).scores()
    assert scores["cpu-only"] >= scores["n1"]  # a node without GPUs strands none


async def test_fragmentation_aware_keeps_a_gpu_less_pod_off_the_node_whose_gpus_it_would_strand(
        state: SchedulerState) -> None:
    # The pool runs 4-core one-GPU pods. n1 has 4 cores left for its two free GPUs, n2 10: a 4-core
    # GPU-less pod on n1 leaves its GPUs no CPU to run on; MostAllocated alone would pick n1, the fuller.
    window = state.workloads.windows.setdefault("p", WorkloadWindow())
    for _ in range(window.prior_pods):
        window.add((4000, 1, 1000, ()))
    await state.on_pod("ADDED", pod_object("a", node="n1", cpu="12"))
    await state.on_pod("ADDED", pod_object("b", node="n2", cpu="6"))
    scores = prioritize(state.snapshot(), request(cpu_milli=4000, gpus=0), ["n1", "n2"]).scores()
    assert scores["n2"] > scores["n1"]


async def test_bestfit_prefers_the_node_left_with_less_cpu(state: SchedulerState) -> None:
    set_pool(state, nodePolicy="bestfit", gpuPolicy="binpack")
    await state.on_pod("ADDED", pod_object("a", node="n2", cpu="8"))
    scores = prioritize(state.snapshot(), request(cpu_milli=1000), ["n1", "n2"]).scores()
    assert scores == {"n1": 0, "n2": 10}
    assert Policy.resolve(Scheduling(nodePolicy=NodePolicy.BESTFIT), request()) == Policy(NodeScorer.BESTFIT)


async def test_a_gpu_less_pod_is_bound_plainly_and_its_cpu_counted_at_once(state: SchedulerState) -> None:
    server = OnePodServer(pod_object("web", cpu="2"))
    assert await Binder(server, state).bind(NAMESPACE, "web", "uid-web", "n2") is None
    assert server.pod["spec"]["nodeName"] == "n2" and not server.pod["metadata"].get("annotations")
    assert state.ledger.usage(state.inventories["n2"]).cpu_milli == 2000
    assert "n2" not in state.accounts.gate.held  # the kubelet allocates it no device: nothing to wait for


async def test_a_gpu_less_bind_that_fails_takes_its_cpu_back(state: SchedulerState) -> None:
    server = OnePodServer(pod_object("web", cpu="2"))
    server.fail_binding = "before"
    with pytest.raises(Exception, match="binding to n2 failed"):
        await Binder(server, state).bind(NAMESPACE, "web", "uid-web", "n2")
    assert state.ledger.usage(state.inventories["n2"]).cpu_milli == 0


def test_host_request_on_the_pod_feed() -> None:
    from rocshare_operator.feed.cluster_facts import pod_facts
    assert pod_facts(pod_object("x", node="n1", cpu="250m")).host == HostRequest(250, 1024)
    assert pod_facts({"metadata": {"name": "y"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}).problem is not None
