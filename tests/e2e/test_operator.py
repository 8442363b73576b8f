"""The operator against the real control plane: pools mark nodes, run the agent
DaemonSet and report status; shares get ResourceQuotas and status; overlapping
pools, nodes changing labels, a share whose pool appears later, and the operator
killed and restarted mid-way. After each change the cluster must converge within
10 seconds.

The operator runs as a subprocess (`rocshare operator --standalone`) so it can be
killed. There is no kubelet and no node agent here: the tests create Node objects
themselves and play the agent by server-side applying AmdGpuNode status, and play
the extender by writing allocation records on pods bound with spec.nodeName.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import API_VERSION
from rocshare.api.node_settings import (
    HAMI_OPERATING_MODE_ANNOTATION,
    PENDING_MODE_ANNOTATION,
    POOL_LABEL,
    POOL_SETTINGS_ANNOTATION,
    decode_settings,
)
from rocshare.kube.client import ApiError, Kube, NotFound, object_path

pytestmark = pytest.mark.e2e

CONVERGE_S = 10.0
AGENT_NAMESPACE = "rocshare-system"
ROCSHARE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "rocshare"


class OperatorProcess:
    """`rocshare operator` as a child process that a test may kill and start again."""

    def __init__(self, kubeconfig: str, log_path: Path) -> None:
        self.kubeconfig, self.log_path = kubeconfig, log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [str(ROCSHARE), "operator", "--kubeconfig", self.kubeconfig, "--namespace", AGENT_NAMESPACE, "--standalone",
             # Only the reconcilers: the extender and webhook have their own tests.
             "--no-extender", "--no-webhook"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: no graceful exit, as a crash or an OOM kill would do."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def assert_alive(self) -> None:
        assert self.process and self.process.poll() is None, self.log_path.read_text()[-4000:]


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory) -> Iterator[OperatorProcess]:
    cluster.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
    # ROCSHARE_OPERATOR_LOG keeps the log somewhere stable for a look after the run.
    log_path = Path(os.environ.get("ROCSHARE_OPERATOR_LOG") or tmp_path_factory.mktemp("operator") / "operator.log")
    process = OperatorProcess(str(cluster.kubeconfig), log_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


# ---- helpers ----------------------------------------------------------------------------------


async def eventually(check: Callable[[], Awaitable[Any]], *, within_s: float = CONVERGE_S) -> Any:
    """Poll `check` until it stops failing; the last failure is raised at the deadline."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await check()
        except (AssertionError, NotFound, KeyError):  # KeyError: a status not written yet
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


def pool_path(name: str, subresource: str | None = None) -> str:
    return object_path(API_VERSION, "amdgpupools", name, subresource=subresource)


async def create_pool(kube: Kube, name: str, selector: dict[str, str], **spec: Any) -> dict:
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": selector, **spec}}
    return await kube.create(object_path(API_VERSION, "amdgpupools"), body)


async def create_node(kube: Kube, name: str, labels: dict[str, str]) -> None:
    await kube.create(object_path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node",
                                                   "metadata": {"name": name, "labels": labels}})


async def relabel_node(kube: Kube, name: str, labels: dict[str, str | None]) -> None:
    await kube.merge_patch(object_path("v1", "nodes", name), {"metadata": {"labels": labels}})


async def play_agent(kube: Kube, node: str, gpus: list[dict]) -> None:
    """What the node agent does: own the AmdGpuNode named after its node and apply its status."""
    path = object_path(API_VERSION, "amdgpunodes", node)
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": node}}
    await kube.apply(path, body, field_manager="rocshare-agent")
    await kube.apply(path + "/status", {**body, "status": {"gpus": gpus}}, field_manager="rocshare-agent")


def gpu(gpu_id: str, index: int, *, cu_count: int = 104, vram_mib: int = 65520, healthy: bool = True) -> dict:
    return {"id": gpu_id, "index": index, "gfxTargetVersion": 90010, "cuCount": cu_count, "vramMiB": vram_mib,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": healthy}


def record(node: str, *devices: dict) -> str:
    return encode_record(AllocationRecord.model_validate(
        {"version": 1, "node": node, "containers": [{"name": "main", "devices": list(devices)}]}))


async def create_slice_pod(kube: Kube, namespace: str, name: str, node: str, allocation: str) -> None:
    """A pod as the extender leaves it after bind: on its node, carrying its allocation record."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {ALLOCATION_ANNOTATION: allocation}},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.invalid/none:0"}]}}

    async def created() -> None:
        try:
            await kube.create(object_path("v1", "pods", namespace=namespace), body)
        except ApiError as error:  # the namespace's default ServiceAccount may not exist yet
            raise AssertionError(str(error)) from None
    await eventually(created)


async def ensure_namespace(kube: Kube, name: str) -> None:
    try:
        await kube.create(object_path("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}})
    except ApiError as error:
        if error.status != 409:
            raise


async def node_marks(kube: Kube, name: str) -> tuple[str | None, str | None, str | None]:
    meta = (await kube.get(object_path("v1", "nodes", name)))["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return (labels.get(POOL_LABEL), annotations.get(POOL_SETTINGS_ANNOTATION),
            annotations.get(HAMI_OPERATING_MODE_ANNOTATION))


async def assert_marked(kube: Kube, node: str, pool: str, mode: str = "cu") -> None:
    label, settings, hami_mode = await node_marks(kube, node)
    assert label == pool, (node, label)
    assert settings is not None and decode_settings(settings).pool == pool
    assert decode_settings(settings).sharing.operating_mode.value == mode
    assert hami_mode == mode


async def assert_unmarked(kube: Kube, node: str) -> None:
    assert await node_marks(kube, node) == (None, None, None), node


async def condition(kube: Kube, path: str, kind: str) -> dict:
    status = (await kube.get(path)).get("status") or {}
    found = [c for c in status.get("conditions", []) if c["type"] == kind]
    assert found, status
    return found[0]


async def gone(kube: Kube, path: str) -> None:
    try:
        await kube.get(path)
    except NotFound:
        return
    raise AssertionError(f"{path} still exists")


def daemonset_path(pool: str) -> str:
    return object_path("apps/v1", "daemonsets", f"rocshare-node-agent-{pool}", namespace=AGENT_NAMESPACE)


# ---- pools -------------------------------------------------------------------------------------


async def test_pool_lifecycle_marks_nodes_runs_agent_and_reports_status(kube: Kube, operator: OperatorProcess) -> None:
    await create_node(kube, "life-1", {"rocshare-test": "life"})
    await create_node(kube, "life-2", {"rocshare-test": "life"})
    await create_node(kube, "life-other", {"rocshare-test": "other"})
    created = await create_pool(kube, "life", {"rocshare-test": "life"})

    async def marked_with_agent() -> None:
        await assert_marked(kube, "life-1", "life")
        await assert_marked(kube, "life-2", "life")
        await assert_unmarked(kube, "life-other")
        daemonset = await kube.get(daemonset_path("life"))
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {POOL_LABEL: "life"}
        assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "rocshare-node-agent"
        owner = daemonset["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("AmdGpuPool", "life", created["metadata"]["uid"])
        ready = await condition(kube, pool_path("life"), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "NoGpusReported")
    await eventually(marked_with_agent)
    operator.assert_alive()

    # The test plays the agent of life-1: two GPUs, one unhealthy; life-2 has not reported.
    await play_agent(kube, "life-1", [gpu("GPU-a1", 0), gpu("GPU-a2", 1, healthy=False)])
    # The test plays the extender: a slice of 8 GiB and 26 of 104 CUs, and a whole GPU.
    await ensure_namespace(kube, "life-ns")
    await create_slice_pod(kube, "life-ns", "slice", "life-1", record(
        "life-1", {"gpuId": "GPU-a1", "memoryMiB": 8192, "cuCount": 26, "cuRanges": [[0, 25]]}))
    await create_slice_pod(kube, "life-ns", "whole", "life-1", record(
        "life-1", {"gpuId": "GPU-a2", "memoryMiB": 65520, "cuCount": 104, "whole": True}))

    async def status_summed() -> None:
        status = (await kube.get(pool_path("life")))["status"]
        assert (status["nodes"], status["gpusTotal"], status["gpusHealthy"]) == (2, 2, 1), status
        assert (status["vramTotalMiB"], status["vramAllocatedMiB"]) == (131040, 8192 + 65520), status
        assert status["coresAllocatedPercent"] == 25 + 100, status
        assert status["observedGeneration"] == created["metadata"]["generation"]
        ready = await condition(kube, pool_path("life"), "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "GpusAvailable")
        degraded = await condition(kube, pool_path("life"), "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "UnhealthyGpus")
        assert "without an AmdGpuNode" in degraded["message"]
    await eventually(status_summed)
    ready_since = (await condition(kube, pool_path("life"), "Ready"))["lastTransitionTime"]

    # Edit the pool: operating mode and agent image.
    await kube.merge_patch(pool_path("life"), {"spec": {"sharing": {"operatingMode": "partition"},
                                                        "agent": {"image": "rocshare/node-agent:edited"}}})

    async def edited() -> None:
        # life-1 holds GPU pods: it keeps its mode until drained (AMD's guide); life-2 switches.
        await assert_marked(kube, "life-1", "life", mode="cu")
        annotations = (await kube.get(object_path("v1", "nodes", "life-1")))["metadata"]["annotations"]
        assert annotations[PENDING_MODE_ANNOTATION] == "partition"
        await assert_marked(kube, "life-2", "life", mode="partition")
        daemonset = await kube.get(daemonset_path("life"))
        assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == "rocshare/node-agent:edited"
        ready = await condition(kube, pool_path("life"), "Ready")
        assert ready["observedGeneration"] == created["metadata"]["generation"] + 1
        assert ready["lastTransitionTime"] == ready_since  # status unchanged: transition time kept
    await eventually(edited)

    # life-1's pods end: it switches to the pool's mode.
    for name in ("slice", "whole"):
        await kube.request("DELETE", object_path("v1", "pods", name, namespace="life-ns"),
                           body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

    async def drained() -> None:
        await assert_marked(kube, "life-1", "life", mode="partition")
        annotations = (await kube.get(object_path("v1", "nodes", "life-1")))["metadata"]["annotations"]
        assert PENDING_MODE_ANNOTATION not in annotations
    await eventually(drained)

    # A node changes labels: life-2 leaves, life-other joins; the GPU heals.
    await relabel_node(kube, "life-2", {"rocshare-test": "other"})
    await relabel_node(kube, "life-other", {"rocshare-test": "life"})
    await play_agent(kube, "life-1", [gpu("GPU-a1", 0), gpu("GPU-a2", 1)])

    async def relabelled() -> None:
        await assert_unmarked(kube, "life-2")
        await assert_marked(kube, "life-other", "life", mode="partition")
        status = (await kube.get(pool_path("life")))["status"]
        assert (status["nodes"], status["gpusHealthy"]) == (2, 2), status
    await eventually(relabelled)

    # Someone deletes the agent DaemonSet: it comes back.
    await kube.delete(daemonset_path("life"))
    await eventually(lambda: kube.get(daemonset_path("life")))

    # A node is deleted: the pool counts one node fewer.
    await kube.delete(object_path("v1", "nodes", "life-other"))

    async def node_gone() -> None:
        status = (await kube.get(pool_path("life")))["status"]
        assert status["nodes"] == 1, status
    await eventually(node_gone)

    # The pool is deleted: its finalizer unmarks the nodes; the DaemonSet follows its owner.
    await kube.delete(pool_path("life"))

    async def released() -> None:
        await gone(kube, pool_path("life"))
        await assert_unmarked(kube, "life-1")
        await gone(kube, daemonset_path("life"))
    await eventually(released)
    operator.assert_alive()


async def test_overlapping_pools_older_keeps_the_node(kube: Kube, operator: OperatorProcess) -> None:
    await create_node(kube, "overlap-1", {"rocshare-test": "overlap", "zone": "z1"})
    await create_node(kube, "overlap-2", {"rocshare-test": "overlap"})
    await create_pool(kube, "overlap-old", {"rocshare-test": "overlap"})
    await asyncio.sleep(1.1)  # creationTimestamp has one-second resolution
    await create_pool(kube, "overlap-new", {"zone": "z1"})

    async def conflict_reported() -> None:
        await assert_marked(kube, "overlap-1", "overlap-old")
        await assert_marked(kube, "overlap-2", "overlap-old")
        status = (await kube.get(pool_path("overlap-new")))["status"]
        assert status["conflictingNodes"] == ["overlap-1"], status
        assert status["nodes"] == 0
        degraded = await condition(kube, pool_path("overlap-new"), "Degraded")
        assert degraded["reason"] == "NodeConflicts"
        events = await kube.list(object_path("v1", "events", namespace="default"),
                                 fieldSelector="involvedObject.name=overlap-new")
        messages = [event["message"] for event in events["items"] if event["reason"] == "NodeConflict"]
        assert any("overlap-old" in m and "overlap-new" in m and "overlap-1" in m for m in messages), messages
    await eventually(conflict_reported)

    # The older pool goes: the node passes to the newer one.
    await kube.delete(pool_path("overlap-old"))

    async def handed_over() -> None:
        await assert_marked(kube, "overlap-1", "overlap-new")
        await assert_unmarked(kube, "overlap-2")
        status = (await kube.get(pool_path("overlap-new")))["status"]
        assert (status["nodes"], status["conflictingNodes"]) == (1, []), status
    await eventually(handed_over)
    await kube.delete(pool_path("overlap-new"))
    await eventually(lambda: assert_unmarked(kube, "overlap-1"))


# ---- shares ------------------------------------------------------------------------------------


def share_path(namespace: str, name: str, subresource: str | None = None) -> str:
    return object_path(API_VERSION, "amdgpushares", name, namespace=namespace, subresource=subresource)


def quota_path(namespace: str, share: str) -> str:
    return object_path("v1", "resourcequotas", f"rocshare-{share}", namespace=namespace)


async def test_share_quota_status_and_pods_of_a_pool_that_appears_later(kube: Kube, operator: OperatorProcess) -> None:
    namespace = "team-share"
    await ensure_namespace(kube, namespace)
    created = await kube.create(object_path(API_VERSION, "amdgpushares", namespace=namespace), {
        "apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": "research", "namespace": namespace},
        "spec": {"limits": {"memoryMiB": 16384, "coresPercent": 250}}})

    async def quota_without_pool() -> None:
        quota = await kube.get(quota_path(namespace, "research"))
        assert quota["spec"]["hard"] == {"limits.amd.com/gpumem": "16384", "limits.amd.com/gpucores": "250"}
        owner = quota["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("AmdGpuShare", created["metadata"]["uid"])
        ready = await condition(kube, share_path(namespace, "research"), "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "QuotaApplied")
    await eventually(quota_without_pool)

    await create_node(kube, "late-1", {"rocshare-test": "late"})
    await create_pool(kube, "late", {"rocshare-test": "late"})
    await play_agent(kube, "late-1", [gpu("GPU-l1", 0, cu_count=304, vram_mib=196592)])
    await create_slice_pod(kube, namespace, "trainer", "late-1", record(
        "late-1", {"gpuId": "GPU-l1", "memoryMiB": 4096, "cuCount": 76, "cuRanges": [[0, 75]]}))

    async def pool_found_usage_counted() -> None:
        ready = await condition(kube, share_path(namespace, "research"), "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "QuotaApplied")
        status = (await kube.get(share_path(namespace, "research")))["status"]
        assert status["used"] == {"memoryMiB": 4096, "coresPercent": 25, "gpus": 1}, status
        assert status["podsTotal"] == 1
        assert status["pods"] == [{"pod": "trainer", "node": "late-1", "gpuIds": ["GPU-l1"], "memoryMiB": 4096,
                                   "cuCount": 76}]
        assert status["quotaName"] == "rocshare-research"
    await eventually(pool_found_usage_counted)

    # Edit the limits: cores removed, GPUs added; the quota follows.
    await kube.merge_patch(share_path(namespace, "research"),
                           {"spec": {"limits": {"coresPercent": None, "gpus": 2}}})

    async def quota_edited() -> None:
        quota = await kube.get(quota_path(namespace, "research"))
        assert quota["spec"]["hard"] == {"limits.amd.com/gpumem": "16384", "requests.amd.com/gpu": "2"}
    await eventually(quota_edited)

    # Someone deletes the quota: it comes back. The pod ends: usage drops.
    await kube.delete(quota_path(namespace, "research"))
    await kube.delete(object_path("v1", "pods", "trainer", namespace=namespace) + "?gracePeriodSeconds=0")

    async def repaired() -> None:
        await kube.get(quota_path(namespace, "research"))
        status = (await kube.get(share_path(namespace, "research")))["status"]
        assert (status["used"]["memoryMiB"], status["podsTotal"], status["pods"]) == (0, 0, []), status
    await eventually(repaired)

    # The pool goes: the share is its namespace's quota, not the pool's, so it holds
    # (docs/accounting.md). The share goes: so does its quota.
    await kube.delete(pool_path("late"))
    await asyncio.sleep(2)
    ready = await condition(kube, share_path(namespace, "research"), "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "QuotaApplied")
    await kube.get(quota_path(namespace, "research"))
    await kube.delete(share_path(namespace, "research"))
    await eventually(lambda: gone(kube, quota_path(namespace, "research")))
    operator.assert_alive()


# ---- restart -----------------------------------------------------------------------------------


async def test_operator_killed_and_restarted_mid_way(kube: Kube, operator: OperatorProcess) -> None:
    await create_node(kube, "restart-1", {"rocshare-test": "restart"})
    await create_node(kube, "restart-2", {"rocshare-test": "restart"})
    await create_pool(kube, "restart-a", {"rocshare-test": "restart"})
    await create_pool(kube, "restart-gone", {"rocshare-test": "restart-gone"})
    await eventually(lambda: assert_marked(kube, "restart-1", "restart-a"))
    await eventually(lambda: kube.get(daemonset_path("restart-gone")))

    operator.kill()
    # While it is down: a node changes labels, a pool is edited, another deleted, a share appears.
    await relabel_node(kube, "restart-2", {"rocshare-test": "restart-gone"})
    await kube.merge_patch(pool_path("restart-a"), {"spec": {"sharing": {"splitCount": 4}}})
    await kube.delete(pool_path("restart-gone"))  # held by its finalizer until the operator is back
    await ensure_namespace(kube, "team-restart")
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace="team-restart"), {
        "apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": "r", "namespace": "team-restart"},
        "spec": {"limits": {"gpus": 1}}})
    operator.start()

    async def converged() -> None:
        _, settings, _ = await node_marks(kube, "restart-1")
        assert settings is not None and decode_settings(settings).sharing.split_count == 4
        await assert_unmarked(kube, "restart-2")
        await gone(kube, pool_path("restart-gone"))
        await gone(kube, daemonset_path("restart-gone"))
        status = (await kube.get(pool_path("restart-a")))["status"]
        assert status["nodes"] == 1, status
        quota = await kube.get(quota_path("team-restart", "r"))
        assert quota["spec"]["hard"] == {"requests.amd.com/gpu": "1"}
        ready = await condition(kube, share_path("team-restart", "r"), "Ready")
        assert ready["status"] == "True"
    await eventually(converged)
    operator.assert_alive()
    await kube.delete(pool_path("restart-a"))
    await eventually(lambda: assert_unmarked(kube, "restart-1"))


def test_restart_log_shows_no_tracebacks(operator: OperatorProcess) -> None:
    text = operator.log_path.read_text()
    assert "Traceback" not in text, text[-6000:]

