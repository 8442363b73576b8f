"""Priority and preemption that understand slices, end to end (issue 40): the real kube-apiserver
and kube-scheduler (the shipped profile, preemptVerb included), the operator process, two
simulated MI210 nodes (the kubelet's device manager, the rocshare agent). Three PriorityClasses.

Evidence from outside rocshare: which pods the API server deleted (a pod watch opened before
each step), and what the kubelet peer handed each container (its per-container records:
ROCR_VISIBLE_DEVICES, HSA_CU_MASK).

Node A:  GPU0 four LOW 25 % slices, GPU1 two MID 50 % slices, GPUs 2-7 one HIGH whole GPU each.
Node B:  GPU0 two LOW 50 % slices, GPUs 1-7 one HIGH whole GPU each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.core.cumask import mask_from_ranges
from rocshare.kube.client import Kube, NotFound, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import (create_pod, gpu_pod, mi210_with_synthetic_vram, read_pod, record_of, runtime_of,
                             scheduling_failures, wait_for, wait_running)

pytestmark = pytest.mark.e2e

NS = "preempt"
POOL = "preempt"
A, B = "preempt-a", "preempt-b"
CLASSES = {"rs-low": 100, "rs-mid": 1000, "rs-high": 10000}


def slice_pod(name: str, cls: str, *, node: str | None = None, pct: int | None = None, gpus: int = 1,
              pin: str | None = None) -> dict:
    limits = {"gpu": str(gpus)}
    if pct is not None:
        limits.update({"gpumem-percentage": str(pct), "gpucores": str(pct)})
    selector = {"rocshare.io/preempt-node": node} if node else {"rocshare.io/sim": POOL}
    pod = gpu_pod(name, namespace=NS, annotations={"amd.com/use-gpu-uuid": pin} if pin else None,
                  node_selector=selector, **limits)
    pod["spec"].update({"priorityClassName": cls, "terminationGracePeriodSeconds": 1})
    return pod


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[dict[str, SimulatedNode]]:
    work = tmp_path_factory.mktemp("preempt")
    cluster.kubectl("create", "namespace", NS)
    for name, value in CLASSES.items():
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}))
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
        "spec": {"nodeSelector": {"rocshare.io/sim": POOL}}}))
    sysfs = mi210_with_synthetic_vram(sysfs_fixtures, work)
    nodes = {name: SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, work_dir=work, sysfs_root=sysfs,
                                 labels={"rocshare.io/sim": POOL, "rocshare.io/preempt-node": name})
             for name in (A, B)}
    try:
        for node in nodes.values():
            node.start()
        yield nodes
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "amdgpupool", POOL, "--ignore-not-found", "--timeout=30s", check=False)
        for node in nodes.values():
            node.stop()
        operator.stop()
        cluster.kubectl("delete", "priorityclass", *CLASSES, "--ignore-not-found", check=False)


async def gpu_ids(kube: Kube, node: str) -> list[str]:
    """The node's GPU ids once its agent published them and the kubelet offers them, else []."""
    try:
        obj = await kube.get(object_path(API_VERSION, "amdgpunodes", node))
        allocatable = (await kube.get(object_path("v1", "nodes", node)))["status"].get("allocatable", {})
    except NotFound:
        return []
    ids = [gpu["id"] for gpu in obj.get("status", {}).get("gpus", [])]
    return ids if int(allocatable.get("amd.com/gpu", "0")) >= len(ids) > 0 else []


class Deletions:
    """Pods the API server marked for deletion or deleted, from a pod watch (not from rocshare)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.names: set[str] = set()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Deletions:
        listed = await self.kube.list(object_path("v1", "pods", namespace=NS))
        version = listed["metadata"]["resourceVersion"]
        started = asyncio.Event()

        async def run() -> None:
            started.set()
            async for event in self.kube.watch(object_path("v1", "pods", namespace=NS), resource_version=version):
                meta = event.object.get("metadata", {})
                if event.type == "DELETED" or meta.get("deletionTimestamp"):
                    self.names.add(meta.get("name", ""))
        self._task = asyncio.create_task(run())
        await started.wait()
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


async def running(kube: Kube, names) -> bool:
    for name in names:
        pod = await read_pod(kube, name, NS)
        if pod is None or pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            return False
    return True


async def gone(kube: Kube, names) -> bool:
    return all([await read_pod(kube, name, NS) is None for name in names])


def env(pod: dict, key: str) -> str:
    return runtime_of(pod)["c0"]["envs"][key]


def cu_mask(pod: dict) -> int:
    """CUs the kubelet peer handed the container (HSA_CU_MASK="0:<ranges>")."""
    spans = env(pod, "HSA_CU_MASK").split(":", 1)[1].split(",")
    return mask_from_ranges([tuple(map(int, span.split("-"))) if "-" in span else (int(span), int(span))
                             for span in spans])


async def our_events(kube: Kube, name: str, reason: str) -> list[str]:
    events = await kube.list(object_path("v1", "events", namespace=NS),
                             fieldSelector=f"involvedObject.name={name},reason={reason}")
    return [event.get("message", "") for event in events.get("items", [])]


async def fill(kube: Kube) -> dict[str, list[str]]:
    ids = {node: await wait_for(lambda node=node: gpu_ids(kube, node), timeout_s=60, what=f"{node} GPUs")
           for node in (A, B)}
    pods = [slice_pod(f"a-low-{i}", "rs-low", node=A, pct=25, pin=ids[A][0]) for i in range(4)]
    pods += [slice_pod(f"a-mid-{i}", "rs-mid", node=A, pct=50, pin=ids[A][1]) for i in range(2)]
    pods += [slice_pod(f"b-low-{i}", "rs-low", node=B, pct=50, pin=ids[B][0]) for i in range(2)]
    pods += [slice_pod(f"a-high-{i}", "rs-high", node=A) for i in range(6)]
    pods += [slice_pod(f"b-high-{i}", "rs-high", node=B) for i in range(7)]
    for pod in pods:
        if await read_pod(kube, pod["metadata"]["name"], NS) is None:
            await create_pod(kube, pod)
    for pod in pods:
        await wait_running(kube, pod["metadata"]["name"], NS, timeout_s=90)
    return ids


async def test_a_60_percent_slice_evicts_exactly_the_low_slices_it_needs(world, kube: Kube) -> None:
    ids = await fill(kube)
    low = [f"a-low-{i}" for i in range(4)]
    before = {name: await read_pod(kube, name, NS) for name in low}
    assert {env(pod, "ROCR_VISIBLE_DEVICES") for pod in before.values()} == {ids[A][0]}
    others = [f"a-mid-{i}" for i in range(2)] + [f"a-high-{i}" for i in range(6)] + \
             [f"b-low-{i}" for i in range(2)] + [f"b-high-{i}" for i in range(7)]
    async with Deletions(kube) as deleted:
        await create_pod(kube, slice_pod("urgent", "rs-high", node=A, pct=60))
        pod = await wait_running(kube, "urgent", NS, timeout_s=90)
    assert len(deleted.names) == 3 and deleted.names <= set(low), deleted.names
    kept = [name for name in low if name not in deleted.names]
    assert await gone(kube, deleted.names)
    assert await running(kube, kept + others), "no other pod is touched"
    # What the kubelet peer handed the preemptor: the victims' GPU, CUs disjoint from the one kept.
    assert env(pod, "ROCR_VISIBLE_DEVICES") == ids[A][0]
    assert record_of(pod).containers[0].devices[0].gpu_id == ids[A][0]
    survivor = await read_pod(kube, kept[0], NS)
    assert cu_mask(pod) & cu_mask(survivor) == 0 and cu_mask(pod).bit_count() == 63  # ceil(104 x 0.6)
    # What users see: an Event on the preemptor and on each victim, naming the GPU freed.
    told = await wait_for(lambda: our_events(kube, "urgent", "PreemptedSlices"), timeout_s=20, what="PreemptedSlices")
    assert all(name in told[0] for name in deleted.names) and ids[A][0] in told[0]
    for name in deleted.names:
        victim = await wait_for(lambda name=name: our_events(kube, name, "Preempted"), timeout_s=20, what="Preempted")
        assert "urgent" in victim[0] and ids[A][0] in victim[0]


async def test_where_two_nodes_could_serve_the_cheaper_victims_go(world, kube: Kube) -> None:
    # A could serve by evicting one MID half on GPU1, B by evicting one LOW half on GPU0: B is cheaper.
    async with Deletions(kube) as deleted:
        await create_pod(kube, slice_pod("urgent-2", "rs-high", pct=50))
        pod = await wait_running(kube, "urgent-2", NS, timeout_s=90)
    assert pod["spec"]["nodeName"] == B
    assert len(deleted.names) == 1 and deleted.names <= {"b-low-0", "b-low-1"}, deleted.names
    assert await running(kube, ["a-mid-0", "a-mid-1"])


async def test_a_pod_that_fits_nowhere_evicts_nothing_and_waits_with_a_reason(world, kube: Kube) -> None:
    # Two whole GPUs: only A's GPU1 (two MID halves) could be emptied anywhere; every other GPU
    # holds a HIGH pod. No set of victims makes room: nothing may be deleted.
    async with Deletions(kube) as deleted:
        await create_pod(kube, slice_pod("hopeless", "rs-high", gpus=2))
        failures = await wait_for(lambda: scheduling_failures(kube, "hopeless", NS), timeout_s=30,
                                  what="hopeless's FailedScheduling event")
        told = await wait_for(lambda: our_events(kube, "hopeless", "PreemptionNotHelpful"), timeout_s=30,
                              what="PreemptionNotHelpful")
        assert deleted.names == set(), deleted.names
    assert failures and "PreemptionWouldNotFit" in told[0]
    assert (await read_pod(kube, "hopeless", NS))["status"]["phase"] == "Pending"
    assert await running(kube, ["a-mid-0", "a-mid-1", "urgent", "urgent-2"])
