"""A pool's operating mode changed under a running pod (AMD's guide: drain a node before
switching its mode). The node that holds the pod keeps its mode and says which one it will
switch to, with a DrainRequired event and the pool Degraded; the pod keeps running with its
slice; once the pod is gone the node switches and its agent reports the new mode."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.api.node_settings import HAMI_OPERATING_MODE_ANNOTATION, PENDING_MODE_ANNOTATION
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.captures import mi210_with_synthetic_vram
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import (create_pod, delete_pod, gpu_pod, one_pool_one_node, read_pod, record_of, wait_for,
                             wait_running)

pytestmark = pytest.mark.e2e

NODE, POOL = "mode-mi210", "mode-pool"
SELECT = {"rocshare.io/pool": POOL}


@pytest.fixture(scope="module")
def node(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[SimulatedNode]:
    work = tmp_path_factory.mktemp("mode")
    with one_pool_one_node(cluster, pool=POOL, sharing={"operatingMode": "cu"}, node=NODE, work_dir=work,
                           sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, work)) as sim:
        yield sim


async def _annotations(kube: Kube) -> dict:
    return (await kube.get(object_path("v1", "nodes", NODE)))["metadata"].get("annotations", {})


async def _agent_mode(kube: Kube) -> str | None:
    status = (await kube.get(object_path(API_VERSION, "amdgpunodes", NODE))).get("status", {})
    return status.get("operatingMode") if status.get("gpus") else None


async def test_mode_change_waits_for_the_running_pod(node, kube: Kube, cluster) -> None:
    await wait_for(lambda: _mode_is(kube, "cu"), timeout_s=60, what="the node marked cu")
    await create_pod(kube, gpu_pod("busy", gpu="1", gpumem="4096", gpucores="25", node_selector=SELECT))
    before = record_of(await wait_running(kube, "busy", timeout_s=90))

    cluster.kubectl("patch", "amdgpupool", POOL, "--type=merge", "-p", '{"spec":{"sharing":{"operatingMode":"partition"}}}')

    async def pending():
        annotations = await _annotations(kube)
        return annotations if annotations.get(PENDING_MODE_ANNOTATION) == "partition" else None

    held = await wait_for(pending, timeout_s=30, what="the pending mode on the busy node")
    assert held[HAMI_OPERATING_MODE_ANNOTATION] == "cu"
    events = json.loads(cluster.kubectl("get", "events", "-A", "--field-selector",
                                        f"involvedObject.name={NODE},reason=DrainRequired", "-o", "json").stdout)
    assert any("kubectl drain" in event["message"] for event in events["items"]), events
    pool = json.loads(cluster.kubectl("get", "amdgpupool", POOL, "-o", "json").stdout)["status"]
    degraded = next(c for c in pool["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "DrainRequired" in degraded["reason"] + degraded["message"], degraded
    pod = await read_pod(kube, "busy")
    assert pod["status"]["phase"] == "Running" and record_of(pod) == before
    assert await _agent_mode(kube) == "cu"

    await delete_pod(kube, "busy")
    switched = await wait_for(lambda: _mode_is(kube, "partition"), timeout_s=60, what="the node switched")
    assert PENDING_MODE_ANNOTATION not in switched
    await wait_for(lambda: _agent_is(kube, "partition"), timeout_s=60, what="the agent in partition mode")


async def _mode_is(kube: Kube, mode: str) -> dict | None:
    annotations = await _annotations(kube)
    return annotations if annotations.get(HAMI_OPERATING_MODE_ANNOTATION) == mode else None


async def _agent_is(kube: Kube, mode: str) -> bool:
    return await _agent_mode(kube) == mode
