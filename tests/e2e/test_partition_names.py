"""Partitions named by kind (AMD's guide: `-resource_naming_strategy=mixed`), end to end: a pool in
partition mode with `resourceNaming: mixed` on a real MI300X CPX capture. The agent registers the
partitions as `amd.com/cpx` (the capture has no memory mode; with one, `amd.com/cpx_nps4`) on the
kubelet peer's real device manager; a pod asking for two of them runs on two whole partitions; a
pod asking for `amd.com/gpu` there waits with the extender's reason; mixing a kind with a slice
resource is refused by the webhook."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Invalid, Kube, object_path
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import (create_pod, delete_pod, gpu_pod, one_pool_one_node, record_of, runtime_of,
                             scheduling_failures, wait_for, wait_running)

pytestmark = pytest.mark.e2e

NODE, POOL = "names-mi300x", "names-pool"
SELECT = {"rocshare.io/pool": POOL}
KIND = "amd.com/cpx"


@pytest.fixture(scope="module")
def node(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[SimulatedNode]:
    with one_pool_one_node(cluster, pool=POOL, sharing={"operatingMode": "partition", "resourceNaming": "mixed"},
                           node=NODE, work_dir=tmp_path_factory.mktemp("names"),
                           sysfs_root=sysfs_fixtures / "mi300x-8gpu-cpx") as sim:
        yield sim


async def _allocatable(kube: Kube) -> dict:
    return (await kube.get(object_path("v1", "nodes", NODE))).get("status", {}).get("allocatable", {})


async def test_partitions_are_offered_and_taken_by_kind(node, kube: Kube) -> None:
    async def offered():
        allocatable = await _allocatable(kube)
        return allocatable if allocatable.get(KIND) == "63" else None

    allocatable = await wait_for(offered, timeout_s=90, what=f"{KIND}: 63 on the node")
    assert allocatable.get("amd.com/gpu", "0") == "0"  # nothing is offered under the single name
    async def published():
        status = (await kube.get(object_path(API_VERSION, "amdgpunodes", NODE))).get("status", {})
        return status if len(status.get("gpus", [])) == 63 else None

    status = await wait_for(published, timeout_s=30, what="the AmdGpuNode's 63 partitions")
    assert {gpu["resource"] for gpu in status["gpus"]} == {KIND}

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two-cpx", "namespace": "default"},
           "spec": {"nodeSelector": SELECT, "containers": [
               {"name": "main", "image": "rocm/pytorch", "resources": {"limits": {KIND: "2"}}}]}}
    await create_pod(kube, pod)
    running = await wait_running(kube, "two-cpx", timeout_s=90)
    devices = record_of(running).containers[0].devices
    assert len(devices) == 2 and all(device.whole for device in devices)
    envs = runtime_of(running)["main"]["envs"]
    assert envs["HIP_VISIBLE_DEVICES"] == "0,1" and "HIP_DEVICE_MEMORY_LIMIT_0" not in envs

    await create_pod(kube, gpu_pod("single-name", gpu="1", node_selector=SELECT))
    failures = await wait_for(lambda: scheduling_failures(kube, "single-name"), timeout_s=30,
                              what="a FailedScheduling event")
    assert any("CardTypeMismatch" in message for message in failures), failures
    for name in ("two-cpx", "single-name"):
        await delete_pod(kube, name)


async def test_a_kind_with_a_slice_resource_is_refused(node, kube: Kube) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mixed-up", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": "rocm/pytorch",
                                    "resources": {"limits": {KIND: "1", "amd.com/gpumem": "1024"}}}]}}
    with pytest.raises(Invalid) as refused:
        await create_pod(kube, pod)
    assert "whole partitions of one kind" in refused.value.message, refused.value.message
