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
  runs, one more MiB stays Pending with ResourceQuotaNotFit).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rocshare.api.models import API_VERSION
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
VALUES, QUOTA = "acct-values", "acct-quota"
GPU_MIB = 65536
SHARE = "team"


def pool(name: str, **sharing: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"rocshare.io/sim": name}, "sharing": sharing}}


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("accounting")
    for namespace in (VALUES, QUOTA):
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
        for namespace in (VALUES, QUOTA):
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
