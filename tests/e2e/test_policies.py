"""Every placement policy through kube-scheduler (issue 14, item 4): the real kube-apiserver and
kube-scheduler with the manifests' profile, the operator's extender, two simulated MI210 nodes
(kubelet peer + agent, synthetic 64 GiB per GPU) in one pool. Each test sets the cluster up so
that the policies must choose differently, and asserts the node or GPUs kube-scheduler bound:

* node: binpack goes to the node that already holds a pod, spread to the empty one -- from the
  pool's nodePolicy and from the pod's `hami.io/node-scheduler-policy`, which overrides the pool;
* GPU: binpack shares the GPU that holds a slice, spread takes an empty one
  (`hami.io/gpu-scheduler-policy` over the pool's gpuPolicy);
* topology-aware: a 2-GPU pod gets two GPUs joined by XGMI where binpack takes the two fullest,
  which are not joined.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import create_pod, delete_pod, gpu_pod, mi210_with_synthetic_vram, record_of, wait_for, wait_running

pytestmark = pytest.mark.e2e

POOL = "policies"
NODES = ("pol-a", "pol-b")
NAMESPACE = "policies"
IN_POOL = {"rocshare.io/pool": POOL}
SLICE = {"gpu": "1", "gpumem": "4096", "gpucores": "25"}


def pool_object(node_policy: str = "binpack", gpu_policy: str = "binpack") -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
            "spec": {"nodeSelector": {"rocshare.io/sim": "policies"},
                     "scheduling": {"nodePolicy": node_policy, "gpuPolicy": gpu_policy}}}


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[dict[str, SimulatedNode]]:
    work = tmp_path_factory.mktemp("policies")
    cluster.kubectl("create", "namespace", NAMESPACE)
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool_object()))
    capture = mi210_with_synthetic_vram(sysfs_fixtures, work)
    nodes = {name: SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, work_dir=work, sysfs_root=capture,
                                 labels={"rocshare.io/sim": "policies"}) for name in NODES}
    try:
        for node in nodes.values():
            node.start()
        yield nodes
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--wait=true", check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "amdgpupools", POOL, "--ignore-not-found", "--timeout=30s", check=False)
        for node in nodes.values():
            node.stop()
        operator.stop()


@pytest.fixture
async def ready(fleet, kube: Kube) -> dict[str, SimulatedNode]:
    async def all_ready():
        for name in NODES:
            node = await kube.get(object_path("v1", "nodes", name))
            if int(node.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0")) == 0:
                return False
            if (node["metadata"].get("labels") or {}).get("rocshare.io/pool") != POOL:
                return False
        return True
    await wait_for(all_ready, timeout_s=90, what="both nodes with GPUs, in the pool")
    yield fleet
    await kube.request("DELETE", object_path("v1", "pods", namespace=NAMESPACE), query={"gracePeriodSeconds": "0"})

    async def empty():
        return not (await kube.list(object_path("v1", "pods", namespace=NAMESPACE))).get("items")
    await wait_for(empty, timeout_s=60, what="the test's pods gone")
    await set_pool(kube)


async def set_pool(kube: Kube, node_policy: str = "binpack", gpu_policy: str = "binpack") -> None:
    await kube.merge_patch(object_path(API_VERSION, "amdgpupools", POOL),
                           {"spec": {"scheduling": {"nodePolicy": node_policy, "gpuPolicy": gpu_policy}}})


async def run(kube: Kube, name: str, *, annotations: dict[str, str] | None = None,
              node_selector: dict[str, str] | None = None, **limits: str) -> dict:
    await create_pod(kube, gpu_pod(name, namespace=NAMESPACE, annotations=annotations,
                                   node_selector={**IN_POOL, **(node_selector or {})}, **(limits or SLICE)))
    return await wait_running(kube, name, NAMESPACE, timeout_s=60)


def gpus_of(pod: dict) -> list[str]:
    return [device.gpu_id for container in record_of(pod).containers for device in container.devices]


async def filled_node(kube: Kube) -> str:
    """One slice pinned to pol-a: the fuller node from then on."""
    pod = await run(kube, "filler", node_selector={"kubernetes.io/hostname": "pol-a"})
    return pod["spec"]["nodeName"]


async def test_node_policy_from_the_pool_and_from_the_pod(ready, kube: Kube) -> None:
    fuller = await filled_node(kube)
    assert (await run(kube, "pool-binpack"))["spec"]["nodeName"] == fuller
    spread = await run(kube, "pod-says-spread", annotations={"hami.io/node-scheduler-policy": "spread"})
    assert spread["spec"]["nodeName"] != fuller, "the pod's annotation overrides the pool's binpack"
    await delete_pod(kube, "pool-binpack", NAMESPACE)
    await delete_pod(kube, "pod-says-spread", NAMESPACE)

    await set_pool(kube, node_policy="spread")
    await wait_for(lambda: _pool_policy_seen(kube, "spread"), timeout_s=10, what="the pool's new policy")
    await asyncio.sleep(2.0)  # the extender's pool watch delivers it a moment later
    assert (await run(kube, "pool-spread"))["spec"]["nodeName"] != fuller
    await delete_pod(kube, "pool-spread", NAMESPACE)
    binpack = await run(kube, "pod-says-binpack", annotations={"hami.io/node-scheduler-policy": "binpack"})
    assert binpack["spec"]["nodeName"] == fuller, "the pod's annotation overrides the pool's spread"


async def test_gpu_policy_binpack_shares_spread_takes_an_empty_gpu(ready, kube: Kube) -> None:
    on_a = {"kubernetes.io/hostname": "pol-a"}
    first = gpus_of(await run(kube, "first", node_selector=on_a))
    packed = gpus_of(await run(kube, "packed", node_selector=on_a,
                               annotations={"hami.io/gpu-scheduler-policy": "binpack"}))
    spread = gpus_of(await run(kube, "spread", node_selector=on_a,
                               annotations={"hami.io/gpu-scheduler-policy": "spread"}))
    assert packed == first
    assert spread != first and spread != packed


async def test_topology_aware_takes_linked_gpus_where_binpack_takes_the_fullest(ready, kube: Kube) -> None:
    status = (await kube.get(object_path(API_VERSION, "amdgpunodes", "pol-a")))["status"]["gpus"]
    by_bdf = {gpu["pciBDF"]: gpu for gpu in status}
    one = status[0]
    far = next(gpu for gpu in status if gpu["pciBDF"] != one["pciBDF"] and gpu["pciBDF"] not in one["xgmiPeers"])
    on_a = {"kubernetes.io/hostname": "pol-a"}
    for name, gpu in (("fill-one", one), ("fill-far", far)):
        await run(kube, name, node_selector=on_a, annotations={"amd.com/use-gpu-uuid": gpu["id"]})
    two = {"gpu": "2", "gpumem": "4096", "gpucores": "25"}
    plain = set(gpus_of(await run(kube, "plain", node_selector=on_a, **two)))
    assert plain == {one["id"], far["id"]}, "binpack takes the two fullest GPUs, which XGMI does not join"
    await delete_pod(kube, "plain", NAMESPACE)
    linked = gpus_of(await run(kube, "linked", node_selector=on_a, annotations={
        "hami.io/gpu-scheduler-policy": "topology-aware"}, **two))
    peers = {gpu["id"]: {by_bdf[bdf]["id"] for bdf in gpu["xgmiPeers"] if bdf in by_bdf} for gpu in status}
    assert linked[1] in peers[linked[0]], f"topology-aware: {linked} are joined by XGMI"


async def _pool_policy_seen(kube: Kube, node_policy: str) -> bool:
    pool = await kube.get(object_path(API_VERSION, "amdgpupools", POOL))
    return pool["spec"]["scheduling"]["nodePolicy"] == node_policy
