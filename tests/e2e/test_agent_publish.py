"""Node agents publishing on the real control plane: two agents for two fixture nodes
(MI210 and Strix Point captures) run the inventory loop in-process and publish their
AmdGpuNode status, HAMi annotation and labels; a device node made unopenable (a dangling
symlink: chmod would not stop root) shows up unhealthy within 5 s and recovers; every
request an agent makes names its own node only."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from rocshare.api.hami import decode_node_register
from rocshare.api.models import API_VERSION, GpuInfo, Sharing
from rocshare.api.node_settings import HAMI_NODE_REGISTER_ANNOTATION, POOL_SETTINGS_ANNOTATION, NodeSettings, encode_settings
from rocshare.kube.client import Kube, object_path
from rocshare_agent.inventory_loop import run_inventory_loop

pytestmark = pytest.mark.e2e

NODE_A, NODE_B = "agent-e2e-mi210", "agent-e2e-strix"


class RecordingKube(Kube):
    """The real client, remembering every request's method and path."""

    def __init__(self, inner: Kube) -> None:
        super().__init__(inner._connection)
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append((method, path, kwargs.get("body")))
        return await super().request(method, path, **kwargs)

    async def close(self) -> None:  # shares the test's connection
        pass


def make_dev_root(root: Path, render_minors: range) -> Path:
    (root / "dri").mkdir(parents=True)
    (root / "kfd").write_text("")
    for minor in render_minors:
        (root / "dri" / f"renderD{minor}").write_text("")
    return root


async def create_node(kube: Kube, name: str, annotations: dict[str, str] | None = None) -> None:
    await kube.delete(object_path("v1", "nodes", name))
    await kube.delete(object_path(API_VERSION, "amdgpunodes", name))
    await kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                        "metadata": {"name": name, "annotations": annotations or {}}})


async def eventually(check, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.1)


async def gpu_status(kube: Kube, name: str) -> dict:
    try:
        return (await kube.get(object_path(API_VERSION, "amdgpunodes", name))).get("status") or {}
    except Exception:
        return {}


async def node_events(kube: Kube, name: str, reason: str) -> list[dict]:
    events = await kube.list("/api/v1/namespaces/default/events",
                             fieldSelector=f"involvedObject.name={name},reason={reason}")
    return events["items"]


@pytest.fixture
async def agents(kube: Kube, sysfs_fixtures: Path, tmp_path: Path):
    settings = encode_settings(NodeSettings(pool="e2e", sharing=Sharing(split_count=4, device_memory_scaling=2.0)))
    await create_node(kube, NODE_A, {POOL_SETTINGS_ANNOTATION: settings})
    await create_node(kube, NODE_B)
    clients = {NODE_A: RecordingKube(kube), NODE_B: RecordingKube(kube)}
    inventories: dict[str, list[list[GpuInfo]]] = {NODE_A: [], NODE_B: []}
    setups = {NODE_A: ("mi210-8gpu-xgmi", range(128, 136)), NODE_B: ("strixpoint-apu", range(128, 129))}
    dev_roots = {}
    tasks = []
    for name, (capture, minors) in setups.items():
        dev_roots[name] = make_dev_root(tmp_path / name, minors)
        tasks.append(asyncio.create_task(run_inventory_loop(
            clients[name], node_name=name, sysfs_root=sysfs_fixtures / capture, dev_root=dev_roots[name],
            interval_s=0.5, heartbeat_s=3600, on_inventory=inventories[name].append)))
    try:
        yield clients, inventories, dev_roots
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_agents_publish_status_annotation_and_labels(kube: Kube, agents) -> None:
    clients, inventories, _ = agents
    status_a = await eventually(lambda: _with_gpus(kube, NODE_A, 8), timeout_s=10, what="MI210 status")
    status_b = await eventually(lambda: _with_gpus(kube, NODE_B, 1), timeout_s=10, what="Strix status")
    assert {gpu["cuCount"] for gpu in status_a["gpus"]} == {104}
    assert {gpu["splitCount"] for gpu in status_a["gpus"]} == {4}  # from the pool settings on the Node
    assert status_a["deviceMemoryScaling"] == 2.0 and status_a["lastHeartbeatTime"]
    assert status_b["gpus"][0]["cuCount"] == 12 and status_b["gpus"][0]["splitCount"] == 10
    assert [c["status"] for c in status_a["conditions"] if c["type"] == "Ready"] == ["True"]

    node_a = await eventually(lambda: _node_with_register(kube, NODE_A), timeout_s=10, what="MI210 annotation")
    register = decode_node_register(node_a["metadata"]["annotations"][HAMI_NODE_REGISTER_ANNOTATION])
    assert len(register) == 8 and {entry["count"] for entry in register} == {4}
    assert register[0]["custominfo"]["pciBDF"] == "0000:63:00.0" and register[0]["health"] is True
    labels = node_a["metadata"]["labels"]
    assert labels["amd.com/gpu.product-name"] == "AMD_Instinct_MI210"
    assert (labels["amd.com/gpu.cu-count"], labels["amd.com/gpu.family"], labels["amd.com/gpu.device-id"]) == ("104", "AI", "740f")
    assert "amd.com/gpu.vram" not in labels  # unknown on this capture
    node_b = await eventually(lambda: _node_with_register(kube, NODE_B), timeout_s=10, what="Strix annotation")
    assert node_b["metadata"]["labels"]["amd.com/gpu.vram"] == "15G"
    assert inventories[NODE_A][0][0].split_count == 4 and len(inventories[NODE_B][0]) == 1


async def test_kubectl_get_amdgpunodes_shows_counts_vram_and_mode(cluster, kube: Kube, agents) -> None:
    """The printer columns count (a JSONPath cannot: the API server keeps the first match of a list)."""
    status_b = await eventually(lambda: _with_gpus(kube, NODE_B, 1), timeout_s=10, what="Strix status")
    await eventually(lambda: _with_gpus(kube, NODE_A, 8), timeout_s=10, what="MI210 status")
    output = cluster.kubectl("get", "amdgpunodes", NODE_A, NODE_B).stdout
    header, *rows = output.splitlines()
    assert header.split()[:8] == ["NAME", "GPUS", "HEALTHY", "VRAM-MIB", "MODE", "HEARTBEAT", "PLUGIN", "READY"]
    by_name = {row.split()[0]: row.split() for row in rows}
    assert by_name[NODE_A][1:5] == ["8", "8", "0", "cu"]  # the MI210 capture has no VRAM size
    strix_vram_mib = status_b["gpus"][0]["vramMiB"]
    assert strix_vram_mib > 15000 and by_name[NODE_B][1:5] == ["1", "1", str(strix_vram_mib), "cu"]


async def test_health_change_within_5_seconds_and_recovery(kube: Kube, agents) -> None:
    clients, inventories, dev_roots = agents
    await eventually(lambda: _with_gpus(kube, NODE_A, 8), timeout_s=10, what="MI210 status")
    await eventually(lambda: _with_gpus(kube, NODE_B, 1), timeout_s=10, what="Strix status")
    await eventually(lambda: _node_with_register(kube, NODE_B), timeout_s=10, what="Strix annotation")
    before_b = (await kube.get(object_path(API_VERSION, "amdgpunodes", NODE_B)))["metadata"]["resourceVersion"]
    node_b_version = (await kube.get(object_path("v1", "nodes", NODE_B)))["metadata"]["resourceVersion"]

    render = dev_roots[NODE_A] / "dri" / "renderD130"
    render.unlink()
    render.symlink_to(dev_roots[NODE_A] / "dri" / "gone")  # dangling: open() fails even for root
    started = time.monotonic()
    status = await eventually(lambda: _gpu_health(kube, NODE_A, 2, False), timeout_s=5, what="GPU 2 unhealthy")
    assert time.monotonic() - started < 5
    assert "cannot be opened" in status["gpus"][2]["healthReason"]
    assert not inventories[NODE_A][-1][2].healthy
    await eventually(lambda: node_events(kube, NODE_A, "AMDGPUUnhealthy"), timeout_s=5, what="event")
    node_a = await kube.get(object_path("v1", "nodes", NODE_A))
    register = decode_node_register(node_a["metadata"]["annotations"][HAMI_NODE_REGISTER_ANNOTATION])
    assert [entry["health"] for entry in register] == [True, True, False, True, True, True, True, True]

    render.unlink()
    render.write_text("")
    await eventually(lambda: _gpu_health(kube, NODE_A, 2, True), timeout_s=5, what="GPU 2 recovered")
    await eventually(lambda: node_events(kube, NODE_A, "AMDGPURecovered"), timeout_s=5, what="event")

    # Node B's agent wrote nothing meanwhile, and no agent ever named another node.
    assert (await kube.get(object_path(API_VERSION, "amdgpunodes", NODE_B)))["metadata"]["resourceVersion"] == before_b
    assert (await kube.get(object_path("v1", "nodes", NODE_B)))["metadata"]["resourceVersion"] == node_b_version
    for name, client in clients.items():
        for method, path, body in client.requests:
            if path.endswith("/events"):
                assert body["involvedObject"]["name"] == name and body["source"]["host"] == name
            elif method == "POST":  # creating its AmdGpuNode
                assert body["metadata"]["name"] == name, (method, path)
            else:
                assert path.split("/")[-1] == name or path.split("/")[-2] == name, (method, path)
            assert method != "DELETE"


async def _with_gpus(kube: Kube, name: str, count: int) -> dict | None:
    status = await gpu_status(kube, name)
    return status if len(status.get("gpus", [])) == count else None


async def _gpu_health(kube: Kube, name: str, index: int, healthy: bool) -> dict | None:
    status = await gpu_status(kube, name)
    gpus = status.get("gpus", [])
    return status if len(gpus) > index and gpus[index]["healthy"] is healthy else None


async def _node_with_register(kube: Kube, name: str) -> dict | None:
    node = await kube.get(object_path("v1", "nodes", name))
    return node if HAMI_NODE_REGISTER_ANNOTATION in (node["metadata"].get("annotations") or {}) else None
