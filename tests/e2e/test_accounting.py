"""One accounting, end to end (issue 16, docs/accounting.md): on the real control plane with the
operator process, kube-scheduler and simulated MI210 nodes (the kubelet's own device manager with
a rocshare agent; the capture copied with a synthetic 64 GiB per GPU):

* quantities are read as the API server writes them: `amd.com/gpumem` 3000, 8000 and 40000 are
  stored as "3k", "8k", "40k" and run with exactly that many MiB in the record and in the
  container's HIP_DEVICE_MEMORY_LIMIT_0; `amd.com/gpu: 1000` ("1k") is admitted and stays Pending
  with the extender's reason (NodeInsufficientGPUs on the 8-GPU node);
* for pods mixing init, native sidecar and app containers, on an Exclusive and a Shared pool, the
  share status and the extender's quota figures are the same numbers, those the pods' requests
  imply; and bind refuses exactly when status says the limit is reached (a pod taking the last MiB
  runs, one more MiB stays Pending with ResourceQuotaNotFit);
* resize (issue 43): a running pod's slice grows and shrinks on its own GPU through the kubectl
  plugin, run as a tenant with `edit` only; a pod bound after the growth gets none of its CUs; it is refused when its neighbour holds the CUs
  (ResizeInsufficientCores) or the share is short (ResizeQuotaExceeded); share status and the
  extender's quota agree with the records before and after; the tenant's request annotation is
  the only part of it the tenant can write (the record and the Resized condition are refused);
  the share's ResourceQuota follows the records too: its `limits.amd.com/*` used (entries Kubernetes
  never counts; the operator writes them) is the records' figures, and a pod that fits the old
  figure but not the grown one is admitted by the API server and held Pending with
  ResourceQuotaNotFit, then runs once the slice shrinks.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.models import API_VERSION
from rocshare.api.resize import RESIZED_CONDITION
from rocshare.core.cumask import mask_from_ranges
from rocshare.core.quantity import whole_quantity
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import (
    create_pod,
    delete_pod,
    gpu_pod,
    mi210_with_synthetic_vram,
    read_pod,
    record_of,
    runtime_of,
    scheduling_failures,
    wait_for,
    wait_running,
)

pytestmark = pytest.mark.e2e

EXCLUSIVE, SHARED = "acct-excl", "acct-shared"
VALUES, QUOTA, RESIZE = "acct-values", "acct-quota", "acct-resize"
GPU_MIB = 65536
SHARE = "team"


def pool(name: str, **sharing: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"rocshare.io/sim": name}, "sharing": sharing}}


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("accounting")
    for namespace in (VALUES, QUOTA, RESIZE):
        cluster.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool(EXCLUSIVE)))
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool(SHARED, omittedCores="Shared")))
    sysfs = mi210_with_synthetic_vram(sysfs_fixtures, work)
    nodes = [SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, work_dir=work, sysfs_root=sysfs,
                           labels={"rocshare.io/sim": name}) for name in (EXCLUSIVE, SHARED)]
    try:
        for node in nodes:
            node.start()
        yield operator
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        for namespace in (VALUES, QUOTA, RESIZE):
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", "--wait=false",
                            check=False)
        cluster.kubectl("delete", "amdgpupools", EXCLUSIVE, SHARED, "--ignore-not-found", "--timeout=30s", check=False)
        for node in nodes:
            node.stop()
        operator.stop()


@pytest.fixture
async def ready(fleet, kube: Kube) -> OperatorProcess:
    async def offers(node: str) -> bool:
        obj = await kube.get(object_path("v1", "nodes", node))
        return obj.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0") not in ("0", None)
    for node in (EXCLUSIVE, SHARED):
        await wait_for(lambda node=node: offers(node), timeout_s=60, what=f"{node} allocatable amd.com/gpu")
    return fleet


def on(pool_name: str) -> dict[str, str]:
    return {"rocshare.io/pool": pool_name}


# ---- quantities ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mib", "stored"), [(3000, "3k"), (8000, "8k"), (40000, "40k")])
async def test_round_mib_run_with_exactly_that_many_mib(ready, kube: Kube, mib: int, stored: str) -> None:
    name = f"mem-{mib}"
    created = await create_pod(kube, gpu_pod(name, namespace=VALUES, gpu="1", gpumem=str(mib), node_selector=on(SHARED)))
    # The API server keeps the canonical form: what every reader of the pod is handed.
    assert created["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpumem"] == stored
    pod = await wait_running(kube, name, VALUES, timeout_s=60)
    device = record_of(pod).containers[0].devices[0]
    assert device.memory_mib == mib and not device.whole
    assert runtime_of(pod)["c0"]["envs"]["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{mib}m"
    await delete_pod(kube, name, VALUES)


async def test_a_thousand_gpus_are_read_as_a_thousand_and_wait_with_a_reason(ready, kube: Kube) -> None:
    created = await create_pod(kube, gpu_pod("gpus-1000", namespace=VALUES, gpu="1000", node_selector=on(SHARED)))
    assert created["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1k"
    failures = await wait_for(lambda: scheduling_failures(kube, "gpus-1000", VALUES), timeout_s=30,
                              what="a FailedScheduling event for 1000 GPUs")
    # The extender reads 1000 (not 1, not a refusal) and says no node has that many GPUs.
    assert any("8/8 NodeInsufficientGPUs" in message for message in failures), failures
    pod = await read_pod(kube, "gpus-1000", VALUES)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    await delete_pod(kube, "gpus-1000", VALUES)


# ---- one accounting: share status, the extender's quota and bind ----------------------------------


def container(name: str, **limits: str) -> dict[str, Any]:
    return {"name": name, "image": "rocm/pytorch",
            "resources": {"limits": {f"amd.com/{key}": value for key, value in limits.items()}}}


def mixed_pod(name: str, pool_name: str, *, init: list[dict] = (), containers: list[dict]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": QUOTA},
            "spec": {"nodeSelector": on(pool_name), "initContainers": list(init), "containers": containers,
                     "terminationGracePeriodSeconds": 0}}


# (pod, what it holds: MiB, cores %, GPUs), by docs/accounting.md, worked out by hand.
MIXED = [
    # An init container then an app container: the init runs first, over the app's slice, so the pod
    # holds max(init, app) -- 4000 MiB, 20 % -- and Kubernetes counts max(init, app) = 1 GPU.
    (mixed_pod("init-and-app", EXCLUSIVE, init=[container("setup", gpu="1", gpumem="2000", gpucores="10")],
               containers=[container("main", gpu="1", gpumem="4000", gpucores="20")]), (4000, 20, 1)),
    # A native sidecar beside a memory-only app slice on an Exclusive pool (every CU reserved: 100 %);
    # the sidecar runs with the app, so Kubernetes counts 1 + 1 GPUs.
    (mixed_pod("sidecar", EXCLUSIVE,
               init=[{**container("proxy", gpu="1", gpumem="1000", gpucores="5"), "restartPolicy": "Always"}],
               containers=[container("main", gpu="1", gpumem="3000")]), (4000, 105, 2)),
    # A memory-only slice on a Shared pool reserves no CU: 0 %.
    (mixed_pod("shared-mem", SHARED, containers=[container("main", gpu="1", gpumem="5000")]), (5000, 0, 1)),
    # A percentage of VRAM and cores: 10 % of 65536 MiB, 15 %.
    (mixed_pod("percent", SHARED, containers=[container("main", **{"gpumem-percentage": "10", "gpucores": "15"})]),
     (GPU_MIB * 10 // 100, 15, 1)),
    # An init container, a sidecar started after it and two app containers: the init lies over the
    # pod's first slot -- the sidecar's slice, which starts only once the init has finished -- so that
    # slot holds max(1500, 500) MiB and max(10, 5) %; the app slices add up beside it.
    (mixed_pod("all-kinds", SHARED,
               init=[container("fetch", gpu="1", gpumem="1500", gpucores="10"),
                     {**container("log", gpu="1", gpumem="500", gpucores="5"), "restartPolicy": "Always"}],
               containers=[container("a", gpu="1", gpumem="2500", gpucores="20"),
                           container("b", gpu="2", gpumem="1000", gpucores="10")]), (1500 + 2500 + 2000, 10 + 20 + 20, 4)),
]


def quota_used(port: int, namespace: str) -> dict[str, float]:
    """The extender's quota figures for the namespace, from its metrics (HAMi's hami_resource_quota_used)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    used = {}
    for line in text.splitlines():
        if line.startswith("hami_resource_quota_used{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("namespace") == namespace:
                used[labels["quota_name"]] = float(line.rsplit(" ", 1)[1])
    return used


async def share_status(kube: Kube) -> dict[str, Any]:
    return (await kube.get(object_path(API_VERSION, "amdgpushares", SHARE, namespace=QUOTA))).get("status") or {}


def as_figures(used: dict[str, float]) -> tuple[int, int, int]:
    return (int(used.get("amd.com/gpumem", -1)), int(used.get("amd.com/gpucores", -1)), int(used.get("amd.com/gpu", -1)))


async def test_status_quota_and_bind_agree_on_the_same_pods(ready, kube: Kube) -> None:
    operator = ready
    total = tuple(sum(held[i] for _, held in MIXED) for i in range(3))
    headroom_mib = 1000
    limits = {"memoryMiB": total[0] + headroom_mib, "coresPercent": total[1] + 100}
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace=QUOTA),
                      {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": SHARE, "namespace": QUOTA},
                       "spec": {"limits": limits}})
    for pod, _held in MIXED:
        await create_pod(kube, pod)
    for pod, _held in MIXED:
        await wait_running(kube, pod["metadata"]["name"], QUOTA, timeout_s=90)

    async def agreeing():
        status = await share_status(kube)
        used = status.get("used") or {}
        from_status = (used.get("memoryMiB"), used.get("coresPercent"), used.get("gpus"))
        from_extender = as_figures(quota_used(operator.metrics_port, QUOTA))
        return (from_status, from_extender) if from_status == from_extender == total else None
    await wait_for(agreeing, timeout_s=30, what=f"share status and the extender's quota both at {total}")
    status = await share_status(kube)
    assert status["podsTotal"] == len(MIXED)
    assert {entry["pod"]: entry["memoryMiB"] for entry in status["pods"]} == {
        pod["metadata"]["name"]: held[0] for pod, held in MIXED}

    # The last MiB the share allows: bound, and status says the limit is reached.
    await create_pod(kube, mixed_pod("last-mib", SHARED, containers=[container("main", gpu="1", gpumem=str(headroom_mib),
                                                                               gpucores="1")]))
    await wait_running(kube, "last-mib", QUOTA, timeout_s=60)

    async def at_limit():
        used = (await share_status(kube)).get("used") or {}
        return used if used.get("memoryMiB") == limits["memoryMiB"] else None
    await wait_for(at_limit, timeout_s=30, what="share status at its memory limit")
    assert as_figures(quota_used(operator.metrics_port, QUOTA))[0] == limits["memoryMiB"]

    # One MiB more: bind refuses, and says why.
    await create_pod(kube, mixed_pod("one-more", SHARED, containers=[container("main", gpu="1", gpumem="1", gpucores="1")]))
    failures = await wait_for(lambda: scheduling_failures(kube, "one-more", QUOTA), timeout_s=30,
                              what="a FailedScheduling event for the pod over quota")
    assert any("ResourceQuotaNotFit" in message for message in failures), failures
    assert (await read_pod(kube, "one-more", QUOTA))["status"]["phase"] == "Pending"

    # Room freed is room again: the pod over quota runs once another ends.
    await delete_pod(kube, "last-mib", QUOTA)
    await wait_running(kube, "one-more", QUOTA, timeout_s=90)


# ---- resize (issue 43) ---------------------------------------------------------------------------

CU_COUNT = 104  # the MI210 capture's CUs
TENANT = "resize-tenant"
PLUGIN = Path(sys.executable).with_name("kubectl-rocshare")


async def free_gpu(kube: Kube, node: str) -> str:
    """A GPU of the node no pod's record names (read from the API server's records)."""
    status = (await kube.get(object_path(API_VERSION, "amdgpunodes", node))).get("status") or {}
    pods = (await kube.list(object_path("v1", "pods"), fieldSelector=f"spec.nodeName={node}")).get("items") or []
    held = {gpu for pod in pods if ALLOCATION_ANNOTATION in (pod["metadata"].get("annotations") or {})
            for gpu in record_of(pod).gpu_ids()}
    return next(gpu["id"] for gpu in reversed(status["gpus"]) if gpu["id"] not in held)


def pinned_pod(name: str, gpu_id: str, mib: int, pct: int) -> dict[str, Any]:
    pod = mixed_pod(name, SHARED, containers=[container("main", gpu="1", gpumem=str(mib), gpucores=str(pct))])
    pod["metadata"].update(namespace=RESIZE, annotations={"amd.com/use-gpu-uuid": gpu_id})
    return pod


def plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), "resize", *args, "-n", RESIZE, "--kubeconfig", str(kubeconfig), "--wait", "30"],
                          capture_output=True, text=True, timeout=60)


def slice_of(pod: dict[str, Any]) -> DeviceSlice:
    return record_of(pod).containers[0].devices[0]


async def agree_at(operator: OperatorProcess, kube: Kube, figures: tuple[int, int, int]) -> None:
    """Share status and the extender's quota (its metrics) both at `figures` (MiB, cores %, GPUs)."""
    seen: list[tuple] = []

    async def agreeing():
        status = (await kube.get(object_path(API_VERSION, "amdgpushares", SHARE, namespace=RESIZE))).get("status") or {}
        used = status.get("used") or {}
        seen[:] = [(used.get("memoryMiB"), used.get("coresPercent"), used.get("gpus")),
                   as_figures(quota_used(operator.metrics_port, RESIZE))]
        return seen[0] == seen[1] == figures
    try:
        await wait_for(agreeing, timeout_s=30, what=f"share status and the extender's quota at {figures}")
    except AssertionError as error:
        raise AssertionError(f"{error}; share status, extender: {seen}") from None


async def quota_mirrors(kube: Kube, figures: tuple[int, int]) -> None:
    """The share's ResourceQuota: hard is the share's limits, whatever the resizes; used is the
    records' (MiB, cores %) -- Kubernetes counts extended resources only under `requests.`, so these
    entries are the operator's alone."""
    seen: list[dict] = []

    async def mirrored():
        quota = await kube.get(object_path("v1", "resourcequotas", f"rocshare-{SHARE}", namespace=RESIZE))
        seen[:] = [quota["spec"]["hard"], (quota.get("status") or {}).get("used") or {}]
        return {key: whole_quantity(value, name=key, unit="count") for key, value in seen[1].items()} == {
            "limits.amd.com/gpumem": figures[0], "limits.amd.com/gpucores": figures[1]}
    try:
        await wait_for(mirrored, timeout_s=30, what=f"the ResourceQuota's used at {figures}")
    except AssertionError as error:
        raise AssertionError(f"{error}; hard, used: {seen}") from None
    assert seen[0] == {"limits.amd.com/gpumem": "20k", "limits.amd.com/gpucores": "60"}, seen  # as stored


def resized_condition(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["status"].get("conditions") or () if c["type"] == RESIZED_CONDITION)


async def test_a_running_slice_is_resized_where_it_is_or_refused_with_a_reason(ready, kube: Kube, cluster) -> None:
    operator = ready
    cluster.kubectl("create", "rolebinding", "tenant-edit", "--clusterrole=edit", f"--user={TENANT}", "-n", RESIZE)
    tenant = cluster.user_kubeconfig(TENANT)
    gpu_id = await free_gpu(kube, SHARED)
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace=RESIZE),
                      {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": SHARE, "namespace": RESIZE},
                       "spec": {"limits": {"memoryMiB": 20000, "coresPercent": 60}}})
    for name in ("notebook", "neighbour"):
        await create_pod(kube, pinned_pod(name, gpu_id, 4096, 10))
        await wait_running(kube, name, RESIZE, timeout_s=90)
    notebook, neighbour = (await read_pod(kube, "notebook", RESIZE), await read_pod(kube, "neighbour", RESIZE))
    before, theirs = slice_of(notebook), slice_of(neighbour)
    assert before.gpu_id == theirs.gpu_id == gpu_id and before.cu_count == theirs.cu_count == math.ceil(CU_COUNT * 0.1)
    await agree_at(operator, kube, (4096 + 4096, 10 + 10, 2))

    # Grow, as the tenant: the same GPU, its own CUs kept, 32 = ceil(104 x 30 %) in all, none of the neighbour's.
    grown = plugin(tenant, "pod/notebook", "--gpumem", "8192", "--gpucores", "30")
    assert grown.returncode == 0 and "Resized: generation 1: " in grown.stdout, (grown.stdout, grown.stderr)
    after = await read_pod(kube, "notebook", RESIZE)
    now = slice_of(after)
    assert (now.gpu_id, now.memory_mib, now.cu_count, now.cores_pct) == (gpu_id, 8192, math.ceil(CU_COUNT * 0.3), 30)
    assert record_of(after).generation == 1 and resized_condition(after)["status"] == "True"
    assert mask_from_ranges(now.cu_ranges) & mask_from_ranges(before.cu_ranges) == mask_from_ranges(before.cu_ranges)
    assert not mask_from_ranges(now.cu_ranges) & mask_from_ranges(theirs.cu_ranges)
    assert after["metadata"]["uid"] == notebook["metadata"]["uid"] and after["status"]["phase"] == "Running"
    await agree_at(operator, kube, (8192 + 4096, 30 + 10, 2))
    await quota_mirrors(kube, (8192 + 4096, 30 + 10))  # the specs would say 4096 + 4096, 10 + 10

    # A pod that fits the old figure (8192 + 9000 <= 20000) but not the grown one (12288 + 9000):
    # the API server admits it (its quota admission counts no `limits.amd.com/*`), the quota check
    # on the records holds it Pending.
    await create_pod(kube, pinned_pod("over-quota", gpu_id, 9000, 10))
    failures = await wait_for(lambda: scheduling_failures(kube, "over-quota", RESIZE), timeout_s=30,
                              what="a FailedScheduling event for the pod over the grown quota")
    assert any("ResourceQuotaNotFit" in message for message in failures), failures
    assert (await read_pod(kube, "over-quota", RESIZE))["status"]["phase"] == "Pending"

    # The scheduler's ledger follows at once: a pod bound to the GPU now gets none of the grown CUs.
    await create_pod(kube, pinned_pod("late", gpu_id, 1024, 10))
    late = slice_of(await wait_running(kube, "late", RESIZE, timeout_s=90))
    assert late.gpu_id == gpu_id
    assert not mask_from_ranges(late.cu_ranges) & (mask_from_ranges(now.cu_ranges) | mask_from_ranges(theirs.cu_ranges))
    await agree_at(operator, kube, (8192 + 4096 + 1024, 30 + 10 + 10, 3))

    # The neighbour cannot take every CU: the notebook holds 32 of them.
    crowded = plugin(tenant, "pod/neighbour", "--gpucores", "100")
    assert crowded.returncode == 1 and "ResizeInsufficientCores: generation 1: " in crowded.stdout, crowded.stdout
    assert slice_of(await read_pod(kube, "neighbour", RESIZE)) == theirs

    # The share is short: 16000 + 4096 + 1024 MiB > 20000.
    short = plugin(tenant, "pod/notebook", "--gpumem", "16000")
    assert short.returncode == 1 and "ResizeQuotaExceeded: generation 2: " in short.stdout, short.stdout
    assert slice_of(await read_pod(kube, "notebook", RESIZE)) == now
    await agree_at(operator, kube, (8192 + 4096 + 1024, 30 + 10 + 10, 3))

    # Shrink, below what it had at the start: its lowest CUs kept.
    shrunk = plugin(tenant, "pod/notebook", "--gpumem", "2048", "--gpucores", "5")
    assert shrunk.returncode == 0 and "Resized: generation 3: " in shrunk.stdout, shrunk.stdout
    small = slice_of(await read_pod(kube, "notebook", RESIZE))
    assert (small.memory_mib, small.cu_count) == (2048, math.ceil(CU_COUNT * 0.05))
    assert mask_from_ranges(small.cu_ranges) & ~mask_from_ranges(now.cu_ranges) == 0
    # The room the shrink gave back is room again: the pod over the grown quota runs.
    await wait_running(kube, "over-quota", RESIZE, timeout_s=90)
    await agree_at(operator, kube, (2048 + 4096 + 1024 + 9000, 5 + 10 + 10 + 10, 4))
    await quota_mirrors(kube, (2048 + 4096 + 1024 + 9000, 5 + 10 + 10 + 10))

    # The tenant's doors: the record and the condition are not the tenant's to write.
    forged = record_of(await read_pod(kube, "notebook", RESIZE)).model_copy(update={
        "resize_generation": 99, "containers": [ContainerAllocation(name="main", devices=[DeviceSlice(
            gpu_id=gpu_id, memory_mib=GPU_MIB, cu_count=CU_COUNT, reserves_all_cores=True)])]})
    as_tenant = ["--kubeconfig", str(tenant), "-n", RESIZE]
    refused = cluster.kubectl(*as_tenant, "annotate", "pod", "notebook", "--overwrite",
                              f"{ALLOCATION_ANNOTATION}={encode_record(forged)}", check=False)
    assert refused.returncode != 0 and "written only by the rocshare scheduler" in refused.stderr, refused.stderr
    condition = {"type": RESIZED_CONDITION, "status": "True", "reason": "Resized", "message": "generation 99: forged"}
    refused = cluster.kubectl(*as_tenant, "patch", "pod", "notebook", "--subresource=status", "--type=strategic",
                              "-p", json.dumps({"status": {"conditions": [condition]}}), check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    assert slice_of(await read_pod(kube, "notebook", RESIZE)) == small
    await agree_at(operator, kube, (2048 + 4096 + 1024 + 9000, 5 + 10 + 10 + 10, 4))
