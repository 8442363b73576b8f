"""Bad gRPC calls to the agent's device plugin on a real unix socket (a grpcio client plays the
kubelet): unknown device IDs, wrong device counts, empty and oversized requests, a record
naming another node's GPU. Every refusal is FAILED_PRECONDITION with a reason that names the
pod and the mismatch; a refused pod is not marked allocated; the server keeps serving afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.models import GpuInfo
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import deviceplugin_pb2_grpc as pb_grpc
from rocshare_agent.deviceplugin.server import PluginUnit
from rocshare_agent.deviceplugin.service import DevicePluginService
from tests.integration.agent.test_plugin_socket import FakeKubelet, wait_for
from tests.agent_fakes import MemoryPods, hook_present

NODE = "n"


def gpu(index: int) -> GpuInfo:
    return GpuInfo(id=f"GPU-{index:016x}", index=index, render_minor=128 + index, gfx_target_version=90010,
                   cu_count=104, pci_bdf=f"0000:{index:02x}:00.0", split_count=2, healthy=True)


def in_flight(name: str, gpu_ids: list[str], *, asks: int | None = None, node: str = NODE) -> dict:
    record = AllocationRecord(node=node, containers=[ContainerAllocation(name="c0", devices=[
        DeviceSlice(gpu_id=g, memory_mib=1024, cu_count=10, cu_ranges=[(0, 9)]) for g in gpu_ids])])
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c0", "resources": {"limits": {"amd.com/gpu": str(asks or len(gpu_ids))}}}]},
            "status": {"phase": "Pending"}}


@pytest.fixture
async def stub(tmp_path: Path):
    kubelet = FakeKubelet(tmp_path)
    await kubelet.start()
    pods = MemoryPods()
    service = DevicePluginService(node_name=NODE, pods=pods, hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1)])
    unit = PluginUnit(service, plugin_dir=tmp_path, poll_s=0.1)
    task = asyncio.create_task(unit.run())
    try:
        await wait_for(lambda: kubelet.requests, 5)
        async with grpc.aio.insecure_channel(f"unix://{unit.socket_path}") as channel:
            yield pb_grpc.DevicePluginStub(channel), pods
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.server.stop(grace=None)


def allocate(*containers: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])


async def refused(stub, request) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Allocate(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    return caught.value.details()


async def test_unknown_device_ids_with_no_pod_in_flight(stub) -> None:
    stub, pods = stub
    details = await refused(stub, allocate(["GPU-ffffffffffffffff::0", "nonsense"]))
    assert "no pod in flight on node n" in details and not pods.refused


async def test_wrong_device_count_for_the_committed_container(stub) -> None:
    stub, pods = stub
    pods.pods.append(in_flight("p", ["GPU-0000000000000000"]))
    details = await refused(stub, allocate(["a", "b"]))
    assert "kubelet asks 2 amd.com/gpu for the next container, but container c0 was committed 1" in details
    assert pods.refused and pods.refused[0][0] == "p"


async def test_more_containers_than_the_record_holds(stub) -> None:
    stub, pods = stub
    pods.pods.append(in_flight("p", ["GPU-0000000000000000"]))
    # The first container completes the pod (one container per call is what the kubelet sends);
    # the extra one finds nothing left in flight.
    details = await refused(stub, allocate(["a"], ["b"]))
    assert "no pod in flight on node n" in details


async def test_record_that_disagrees_with_the_pod_limits(stub) -> None:
    stub, pods = stub
    pods.pods.append(in_flight("p", ["GPU-0000000000000000"], asks=2))
    details = await refused(stub, allocate(["a", "b"]))
    assert "record commits c0=1 but the pod asks c0=2" in details


async def test_record_naming_a_gpu_this_node_does_not_have(stub) -> None:
    stub, pods = stub
    pods.pods.append(in_flight("p", ["GPU-00000000000000ff"]))
    details = await refused(stub, allocate(["a"]))
    assert "committed GPU GPU-00000000000000ff is not on this node" in details


async def test_record_committed_for_another_node(stub) -> None:
    stub, pods = stub
    pods.pods.append(in_flight("p", ["GPU-0000000000000000"], node="elsewhere"))
    assert "its record names node elsewhere but it is bound to n" in await refused(stub, allocate(["a"]))


async def test_two_pods_in_flight_refuses_rather_than_guessing(stub) -> None:
    stub, pods = stub
    pods.pods += [in_flight("p1", ["GPU-0000000000000000"]), in_flight("p2", ["GPU-0000000000000001"])]
    assert "2 pods in flight on node n" in await refused(stub, allocate(["a"]))


async def test_preferred_allocation_with_unknown_ids_and_impossible_sizes(stub) -> None:
    stub, _ = stub
    reply = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=["x", "y"], must_include_deviceIDs=["z"],
                                               allocation_size=5)]))
    assert len(reply.container_responses) == 1  # an answer (the kubelet falls back), not a crash


async def test_server_still_serves_after_the_bad_calls(stub) -> None:
    stub, pods = stub
    await refused(stub, allocate(["junk"]))
    pods.pods.append(in_flight("good", ["GPU-0000000000000001"]))
    reply = await stub.Allocate(allocate(["GPU-0000000000000001::0"]))
    assert reply.container_responses[0].envs["ROCR_VISIBLE_DEVICES"] == "GPU-0000000000000001"
    with pytest.raises(grpc.aio.AioRpcError):  # served: no longer in flight, though nothing was written
        await stub.Allocate(allocate(["GPU-0000000000000001::0"]))
