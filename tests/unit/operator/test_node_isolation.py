"""AmdGpuNode status.isolation (status/node_isolation.py): which pods share each XCD or shader
engine, from allocation records as pods carry them. The expected tables are the test's own, from
the kernel's rule for GFX 9.4.3 (amdkfd mqd_symmetrically_map_cu_mask: with n XCCs under one KFD
node, mask bit i goes to XCC i mod n; n = 8 on an MI300X in SPX mode, 38 CUs each)."""

from __future__ import annotations

import asyncio
import logging

from rocshare.api.models import API_VERSION, AmdGpuNodeStatus, GpuInfo
from rocshare.kube.client import object_path
from rocshare_operator.context import LoopState
from rocshare_operator.feed.cluster_facts import gpu_facts
from rocshare_operator.reconcilers import nodes_status
from rocshare_operator.reconcilers.pools import FIELD_MANAGER, publish_isolation
from rocshare_operator.status.node_isolation import node_isolation
from rocshare_operator.status.usage import pod_slices
from tests.unit.operator.test_cluster_feed import GPU_NODES, NODES, PODS, node, operator_context, settle
from tests.unit.operator.test_cluster_feed import pod as feed_pod
from tests.unit.operator.test_pool_loops import WritingKube
from tests.unit.operator.test_status_logic import container, pod

NODE = "n"
SPX_TOPOLOGY = {"numXCC": 8, "arrayCount": 4, "simdArraysPerEngine": 1, "cuPerSimdArray": 10}


def gpu(gpu_id: str, index: int, *, topology: dict | None = SPX_TOPOLOGY) -> GpuInfo:
    return GpuInfo.model_validate({
        "id": gpu_id, "index": index, "gfxTargetVersion": 90402, "cuCount": 304, "pciBDF": f"0000:{index:02x}:00.0",
        "splitCount": 8, "healthy": True, "cuTopology": topology})


def on_xcds(*xcds: int) -> list[list[int]]:
    """CU ranges of the bits the kernel deals to these XCDs: i with i mod 8 in xcds."""
    return [[bit, bit] for bit in range(304) if bit % 8 in xcds]


def slice_on(gpu_id: str, ranges: list[list[int]]) -> dict:
    return {"gpuId": gpu_id, "memoryMiB": 1024, "cuCount": len(ranges), "cuRanges": ranges, "coresPct": 25}


def test_two_slices_on_whole_xcds_and_a_shared_slice_on_every_xcd() -> None:
    gpus = [gpu_facts(gpu("GPU-a", 0)), gpu_facts(gpu("GPU-idle", 1))]
    pods = [pod_slices(pod("svc-a", NODE, container("c", slice_on("GPU-a", on_xcds(0, 1))), namespace="t1")),
            pod_slices(pod("svc-b", NODE, container("c", slice_on("GPU-a", on_xcds(2, 3))), namespace="t2")),
            # a Shared slice reserves no CUs: it runs on every one
            pod_slices(pod("mem-only", NODE, container("c", slice_on("GPU-a", [])), namespace="t3"))]
    (found,) = node_isolation(gpus, pods)  # the idle GPU is left out
    assert (found["gpuId"], found["unit"]) == ("GPU-a", "XCD")
    assert [unit["index"] for unit in found["units"]] == list(range(8))
    assert all(unit["cuCount"] == 38 for unit in found["units"])
    expected = {0: "t1/svc-a", 1: "t1/svc-a", 2: "t2/svc-b", 3: "t2/svc-b"}
    for unit in found["units"]:
        tenants = {tenant["pod"]: tenant["cusHeld"] for tenant in unit["tenants"]}
        want = {"t3/mem-only": 38} | ({expected[unit["index"]]: 38} if unit["index"] in expected else {})
        assert tenants == want, unit


def test_a_contiguous_range_is_on_every_xcd() -> None:
    # What a Packed layout (or any record from before issue 41) holds: 0-75 puts 9 or 10 CUs on each XCD.
    pods = [pod_slices(pod("packed", NODE, container("c", slice_on("GPU-a", [[0, 75]])), namespace="t"))]
    (found,) = node_isolation([gpu_facts(gpu("GPU-a", 0))], pods)
    per_xcd = [sum(1 for bit in range(76) if bit % 8 == xcd) for xcd in range(8)]
    assert [unit["tenants"] for unit in found["units"]] == [[{"pod": "t/packed", "cusHeld": n}] for n in per_xcd]


def test_gpus_without_topology_and_unreadable_records_are_left_out() -> None:
    gpus = [gpu_facts(gpu("GPU-old-agent", 0, topology=None))]
    pods = [pod_slices(pod("p", NODE, container("c", slice_on("GPU-old-agent", on_xcds(0))))),
            pod_slices(pod("garbled", NODE, annotation="{not json"))]
    assert node_isolation(gpus, pods) == []


def test_the_agents_status_never_writes_isolation() -> None:
    # The agent applies its whole status with its own field manager: a field it serialises, it owns
    # (and would clear). Unset, isolation stays out of its body, so the operator's stays.
    assert "isolation" not in AmdGpuNodeStatus(gpus=[gpu("GPU-a", 0)]).to_json_dict()


# ---- the writer (reconcilers/pools.publish_isolation), on the scripted API of test_pool_loops ----------------


def spx_gpu_node(name: str, *, healthy: bool = True) -> dict:
    return {"metadata": {"name": name}, "status": {"gpus": [gpu("GPU-a", 0).to_json_dict() | {"healthy": healthy}]}}


async def test_the_pool_loop_applies_isolation_once_per_change_with_its_own_field_manager() -> None:
    allocation = '{"version": 1, "node": "n1", "containers": [{"name": "c", "devices": [%s]}]}'
    record = allocation % ('{"gpuId": "GPU-a", "memoryMiB": 1024, "cuCount": 76, "coresPct": 25, "cuRanges": '
                           + str(on_xcds(0, 1)) + '}')
    kube = WritingKube({NODES: [node("n1")], GPU_NODES: [spx_gpu_node("n1")],
                        PODS: [feed_pod("svc", allocation=record, phase="Running")]})
    applied: list[tuple[str, dict, str]] = []

    async def apply(path: str, body: dict, *, field_manager: str, force: bool = True) -> dict:
        applied.append((path, body, field_manager))
        return {}

    kube.apply = apply
    ctx = operator_context(kube)
    nodes_status.subscribe(ctx)
    task = asyncio.create_task(ctx.feed.run())
    await ctx.feed.wait_synced()
    await settle()
    state, log = LoopState(), logging.getLogger("test")
    await publish_isolation(ctx, state, "n1", logger=log)
    await publish_isolation(ctx, state, "n1", logger=log)  # nothing changed: no second write
    ((path, body, manager),) = applied
    assert path == object_path(API_VERSION, "amdgpunodes", "n1", subresource="status") and manager == FIELD_MANAGER
    assert set(body["status"]) == {"isolation"}  # only the operator's field: the agent's stay its own
    (found,) = body["status"]["isolation"]
    assert [[t["pod"] for t in unit["tenants"]] for unit in found["units"]] == [["ns/svc"]] * 2 + [[]] * 6

    kube.push(GPU_NODES, "MODIFIED", spx_gpu_node("n1", healthy=False))  # new facts (or a re-created object)
    await settle()
    await publish_isolation(ctx, state, "n1", logger=log)
    assert len(applied) == 2 and applied[1][1] == body  # written again, the same
    task.cancel()
