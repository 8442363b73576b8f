"""Init containers counted as Kubernetes counts them (issue 34, docs/accounting.md section 1), on
the real control plane with the operator, kube-scheduler and one simulated node with ONE GPU (the
Vega10 capture: 64 CUs, 16368 MiB) driven by the kubelet's own device manager:

* a pod whose plain init container asks 60 % of the GPU's compute and whose app container asks
  60 % runs: the init container finishes before the app starts, so the pod holds max(init, app)
  -- ceil(0.6 x 64) = 39 CUs, not 78 of 64 -- and what the kubelet peer handed each container
  says so: the init container's CU mask lies inside the app's, each with its own memory limit;
* a pod whose native sidecar (restartPolicy Always) asks 60 % beside an app container asking 60 %
  is still refused with CardInsufficientCore: a sidecar runs beside the app, 78 CUs of 64;
* the share's status and the extender's quota figures agree on what the namespace holds, and the
  ResourceQuota the API server keeps counts requests.amd.com/gpu by the same rule (max(init, app);
  a sidecar with the app).
All expected figures are worked out here from the pods' requests and the GPU's CU count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from rocshare.api.models import API_VERSION
from rocshare.core.cumask import mask_from_ranges
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from tests.e2e.fleet import create_pod, one_pool_one_node, runtime_of, scheduling_failures, wait_for, wait_running
from tests.e2e.test_accounting import as_figures, quota_used

pytestmark = pytest.mark.e2e

POOL = NODE = "init-vega"
NAMESPACE = "init-counting"
SHARE = "team"
GPU_CUS, GPU_MIB = 64, 16368  # the Vega10 capture's one GPU
CUS_60 = math.ceil(GPU_CUS * 60 / 100)  # 39


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("init-containers")
    cluster.kubectl("create", "namespace", NAMESPACE)
    operator = OperatorProcess(cluster)
    with one_pool_one_node(cluster, pool=POOL, sharing={}, node=NODE, work_dir=work, operator=operator,
                           sysfs_root=sysfs_fixtures / "vega10-1gpu"):
        try:
            yield operator
        finally:
            cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0",
                            "--wait=false", check=False)


def container(name: str, *, mib: int, cores_pct: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "rocm/pytorch", **extra, "resources": {"limits": {
        "amd.com/gpu": "1", "amd.com/gpumem": str(mib), "amd.com/gpucores": str(cores_pct)}}}


def pod(name: str, *, init: list[dict], app: list[dict]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeSelector": {"rocshare.io/pool": POOL}, "initContainers": init, "containers": app,
                     "terminationGracePeriodSeconds": 0}}


def cu_set(envs: dict[str, str]) -> int:
    """The CUs of HSA_CU_MASK "0:<ranges>" (one GPU), as a bitmask."""
    index, _, ranges = envs["HSA_CU_MASK"].partition(":")
    assert index == "0"
    pairs = [part.split("-") for part in ranges.split(",")]
    return mask_from_ranges((int(pair[0]), int(pair[-1])) for pair in pairs)


async def offers_gpus(kube: Kube) -> bool:
    node = await kube.get(object_path("v1", "nodes", NODE))
    return node.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0") not in ("0", None)


async def test_init_then_app_runs_and_a_sidecar_beside_the_app_is_refused(fleet, kube: Kube) -> None:
    operator = fleet
    await wait_for(lambda: offers_gpus(kube), timeout_s=60, what=f"{NODE} allocatable amd.com/gpu")
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace=NAMESPACE), {
        "apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": SHARE, "namespace": NAMESPACE},
        "spec": {"limits": {"memoryMiB": 10000, "coresPercent": 200, "gpus": 4}}})
    # The operator writes the share's ResourceQuota; kube-controller-manager's quota controller gives it its
    # first status. From then on the API server's quota admission counts each pod as it admits it, so the
    # figure checked below does not wait on the controller (its workers pause while discovery re-syncs
    # monitors for kinds other tests install, and after kube-apiserver restarts: CI once saw no count in 120 s).
    await wait_quota_gpus_used(kube, "0", timeout_s=120)

    # The sidecar runs beside the app: 39 + 39 CUs of 64, on the node's only GPU.
    await create_pod(kube, pod("sidecar-and-app",
                               init=[container("proxy", mib=1000, cores_pct=60, restartPolicy="Always")],
                               app=[container("main", mib=1000, cores_pct=60)]))
    failures = await wait_for(lambda: scheduling_failures(kube, "sidecar-and-app", NAMESPACE), timeout_s=60,
                              what="a FailedScheduling event for the sidecar pod")
    assert any("CardInsufficientCore" in message for message in failures), failures

    # The init container runs alone, before the app: the pod holds max(init, app) of the one GPU.
    await create_pod(kube, pod("init-then-app", init=[container("setup", mib=3000, cores_pct=60)],
                               app=[container("main", mib=2000, cores_pct=60)]))
    running = await wait_running(kube, "init-then-app", NAMESPACE, timeout_s=90)
    received = runtime_of(running)  # what the kubelet peer handed the runtime, per container
    setup, main = cu_set(received["setup"]["envs"]), cu_set(received["main"]["envs"])
    assert setup.bit_count() == main.bit_count() == CUS_60
    assert setup & ~main == 0, "the init container's CUs lie inside what the pod holds for its app"
    assert received["setup"]["envs"]["HIP_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert received["main"]["envs"]["HIP_DEVICE_MEMORY_LIMIT_0"] == "2000m"

    # What the namespace holds: the running pod only (the sidecar pod is not bound), by max(init, app):
    # max(3000, 2000) MiB, max(60, 60) %, max(1, 1) GPU.
    expected = (3000, 60, 1)

    async def agreeing():
        used = ((await kube.get(object_path(API_VERSION, "amdgpushares", SHARE, namespace=NAMESPACE)))
                .get("status") or {}).get("used") or {}
        from_status = (used.get("memoryMiB"), used.get("coresPercent"), used.get("gpus"))
        from_extender = as_figures(quota_used(operator.metrics_port, NAMESPACE))
        return (from_status, from_extender) if from_status == from_extender == expected else None
    await wait_for(agreeing, timeout_s=30, what=f"share status and the extender's quota both at {expected}")

    # The API server's own quota counts every admitted pod's requests.amd.com/gpu by Kubernetes' rule:
    # max(init 1, app 1) = 1 for the init pod, sidecar 1 + app 1 = 2 for the sidecar pod.
    await wait_quota_gpus_used(kube, "3", timeout_s=60)


async def wait_quota_gpus_used(kube: Kube, want: str, *, timeout_s: float) -> None:
    """Wait until the namespace's one ResourceQuota says `want` for requests.amd.com/gpu used; on a timeout,
    say every reading the API server gave, in order."""
    seen: list[list[str | None]] = []

    async def reading() -> bool:
        quotas = await kube.list(object_path("v1", "resourcequotas", namespace=NAMESPACE))
        used = [item.get("status", {}).get("used", {}).get("requests.amd.com/gpu") for item in quotas["items"]]
        if not seen or seen[-1] != used:
            seen.append(used)
        return used == [want]
    try:
        await wait_for(reading, timeout_s=timeout_s, what=f"the ResourceQuota's requests.amd.com/gpu used at {want}")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}; readings in order: {seen}") from timeout
