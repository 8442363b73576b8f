"""A burst on a small fleet: 200 slice pods created at once across 10 simulated MI210 nodes
must all run within 60 s, with no GPU over capacity and no overlapping CU ranges; the
extender's latency histograms are on /metrics; and after the operator is killed, the
rebuilt ledger keeps every slice it had (a new pod never lands on a held range).

The MI210 capture carries no VRAM size; the nodes use a copy with a synthetic 64 GiB per GPU.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare.kube.client import Kube, object_path
from tests.e2e.fleet import create_pod, gpu_pod, mi210_with_synthetic_vram, record_of, runtime_of, wait_for

pytestmark = pytest.mark.e2e

NODES = 10
PODS = 200
NAMESPACE = "burst"
POOL = {"rocshare.io/pool": "burst"}


@pytest.fixture(scope="module")
def burst_fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[tuple[OperatorProcess, list[SimulatedNode]]]:
    work = tmp_path_factory.mktemp("burst")
    cluster.kubectl("create", "namespace", NAMESPACE)
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    pool = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "burst"},
            "spec": {"nodeSelector": {"rocshare.io/sim": "burst"}}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool))
    sysfs = mi210_with_synthetic_vram(sysfs_fixtures, work)
    nodes = [SimulatedNode(name=f"burst-{index}", kubeconfig=cluster.kubeconfig, work_dir=work, sysfs_root=sysfs,
                           labels={"rocshare.io/sim": "burst"}) for index in range(NODES)]
    try:
        for node in nodes:
            node.start()
        yield operator, nodes
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0", check=False)
        # The pool goes while the operator runs: its finalizer unmarks the nodes first.
        cluster.kubectl("delete", "amdgpupool", "burst", "--ignore-not-found", "--timeout=30s", check=False)
        for node in nodes:
            node.stop()
        operator.stop()


async def pods_in(kube: Kube) -> list[dict]:
    return (await kube.list(object_path("v1", "pods", namespace=NAMESPACE)))["items"]


def assert_no_overbooking(pods: list[dict], capacity: dict[str, tuple[int, int, int]]) -> None:
    """Per GPU: memory, CUs and slices within capacity; co-tenant CU ranges disjoint."""
    memory: dict[str, int] = defaultdict(int)
    slices: dict[str, int] = defaultdict(int)
    cus: dict[str, set[int]] = defaultdict(set)
    for pod in pods:
        if "rocshare.io/allocation" not in pod["metadata"].get("annotations", {}):
            continue
        for container in record_of(pod).containers:
            for device in container.devices:
                key = device.gpu_id + "@" + record_of(pod).node
                memory[key] += device.memory_mib
                slices[key] += 1
                for low, high in device.cu_ranges:
                    held = set(range(low, high + 1))
                    assert not held & cus[key], f"overlapping CU ranges on {key}"
                    cus[key] |= held
    for key in memory:
        memory_mib, cu_count, split_count = capacity[key.split("@")[0]]
        assert memory[key] <= memory_mib, f"{key} over memory: {memory[key]} > {memory_mib}"
        assert len(cus[key]) <= cu_count and slices[key] <= split_count, key


async def test_burst_of_200_slices_runs_within_60_s(burst_fleet, kube: Kube, cluster) -> None:
    operator, nodes = burst_fleet
    for node in nodes:
        await wait_for(lambda n=node.name: _allocatable(kube, n), timeout_s=60, what=f"{node.name} allocatable")
    gpus = (await kube.get(object_path(API_VERSION, "amdgpunodes", nodes[0].name)))["status"]["gpus"]
    capacity = {gpu["id"]: (gpu["vramMiB"], gpu["cuCount"], gpu["splitCount"]) for gpu in gpus}

    started = time.monotonic()
    await asyncio.gather(*(create_pod(kube, gpu_pod(f"slice-{index}", namespace=NAMESPACE, gpu="1",
                                                    gpumem="2048", gpucores="10", node_selector=POOL))
                           for index in range(PODS)))

    async def all_running():
        pods = await pods_in(kube)
        running = [pod for pod in pods if pod.get("status", {}).get("phase") == "Running"]
        return pods if len(running) == PODS else None

    pods = await wait_for(all_running, timeout_s=60, what=f"{PODS} pods Running", every_s=1.0)
    elapsed_s = time.monotonic() - started
    print(f"{PODS} slice pods on {NODES} nodes Running after {elapsed_s:.1f} s")
    assert_no_overbooking(pods, capacity)
    for pod in pods[:20]:  # the environment is the record's, container by container
        device = record_of(pod).containers[0].devices[0]
        expected = "0:" + ",".join(f"{low}-{high}" if low != high else f"{low}" for low, high in device.cu_ranges)
        assert runtime_of(pod)["c0"]["envs"]["HSA_CU_MASK"] == expected

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
    for verb in ("filter", "prioritize", "bind"):
        assert f'rocshare_extender_request_duration_seconds_count{{verb="{verb}"}}' in metrics, verb
    assert 'rocshare_extender_decisions_total{outcome="bound",verb="bind"}' in metrics

    # Kill the operator (as a crash would) and start it again: the ledger is rebuilt from the
    # records on the pods, so new pods only get what is really free.
    operator.kill()
    operator.start()
    operator.wait_webhook_serving()
    await asyncio.gather(*(create_pod(kube, gpu_pod(f"after-{index}", namespace=NAMESPACE, gpu="1", gpumem="2048",
                                                    gpucores="10", node_selector=POOL)) for index in range(20)))
    pods = await wait_for(lambda: _running_count(kube, PODS + 20), timeout_s=60, what="20 more pods Running")
    assert_no_overbooking(pods, capacity)


async def _allocatable(kube: Kube, node: str) -> bool:
    obj = await kube.get(object_path("v1", "nodes", node))
    return int(obj.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0")) > 0


async def _running_count(kube: Kube, expected: int) -> list[dict] | None:
    pods = await pods_in(kube)
    running = [pod for pod in pods if pod.get("status", {}).get("phase") == "Running"]
    return pods if len(running) == expected else None
