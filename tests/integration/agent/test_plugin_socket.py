"""server: the device plugin on a real unix socket in a temp folder, with a real grpcio client
playing the kubelet (its Registration service on kubelet.sock, then calls on our socket):
serve-then-register, owner-only socket, typed errors as gRPC codes, and re-registration
within 5 s when the kubelet restarts (every socket deleted, kubelet.sock re-created)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc
import pytest

from rocshare.api.models import GpuInfo
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import deviceplugin_pb2_grpc as pb_grpc
from rocshare_agent.deviceplugin.server import PluginUnit
from rocshare_agent.deviceplugin.service import DevicePluginService
from tests.agent_fakes import hook_present


class FakeKubelet(pb_grpc.RegistrationServicer):
    """Records registrations; like the kubelet, calls the plugin back before answering."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.requests: list[pb.RegisterRequest] = []
        self.server: grpc.aio.Server | None = None

    async def Register(self, request, context):  # noqa: N802
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}") as channel:
            await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=5)
        self.requests.append(request)
        return pb.Empty()

    async def start(self) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await self.server.start()

    async def restart(self) -> None:
        """What a kubelet restart does to the folder: stop, delete every socket, serve anew."""
        await self.server.stop(grace=None)
        for path in self.plugin_dir.iterdir():
            if path.is_socket():
                path.unlink()
        await self.start()


class NoPods:
    def cached(self):
        return []

    async def next_event(self, timeout_s):
        return False

    async def fresh(self):
        return []

    async def mark_refused(self, ref, reason):
        raise AssertionError("no pod to blame")


def gpu(index: int) -> GpuInfo:
    return GpuInfo(id=f"GPU-{index:016x}", index=index, render_minor=128 + index, gfx_target_version=90010,
                   cu_count=104, pci_bdf=f"0000:{index:02x}:00.0", split_count=3, healthy=True)


async def wait_for(predicate, timeout_s: float) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not predicate():
        if loop.time() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return loop.time() - started


@pytest.fixture
async def plugin(tmp_path: Path):
    kubelet = FakeKubelet(tmp_path)
    await kubelet.start()
    service = DevicePluginService(node_name="n", pods=NoPods(), hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1)])
    unit = PluginUnit(service, plugin_dir=tmp_path, poll_s=0.1)
    task = asyncio.create_task(unit.run())
    try:
        await wait_for(lambda: kubelet.requests, 5)
        yield kubelet, unit, service
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.server.stop(grace=None)


async def test_registers_after_serving_with_the_published_fields(plugin):
    kubelet, unit, _ = plugin
    request = kubelet.requests[0]
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", unit.socket_name, "amd.com/gpu")
    assert request.options.get_preferred_allocation_available


async def test_socket_is_not_world_writable(plugin):
    _, unit, _ = plugin
    mode = unit.socket_path.stat().st_mode
    assert stat.S_ISSOCK(mode) and not mode & (stat.S_IWOTH | stat.S_IWGRP)


async def test_list_and_watch_and_allocate_over_the_socket(plugin):
    _, unit, service = plugin
    async with grpc.aio.insecure_channel(f"unix://{unit.socket_path}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        stream = stub.ListAndWatch(pb.Empty())
        first = await stream.read()
        assert len(first.devices) == 6
        service.set_inventory([gpu(0)])
        assert len((await asyncio.wait_for(stream.read(), 2)).devices) == 3
        stream.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["a"])]))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pod in flight on node n" in caught.value.details()


async def test_registers_again_within_5_s_after_a_kubelet_restart(plugin):
    kubelet, unit, _ = plugin
    await kubelet.restart()
    elapsed_s = await wait_for(lambda: len(kubelet.requests) == 2, 5)
    assert unit.socket_path.is_socket() and unit.registrations == 2
    print(f"re-registered {elapsed_s:.2f} s after the kubelet restart")
