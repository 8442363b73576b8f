"""The device plugin on its unix socket, and its registration with the kubelet.

`PluginUnit.run` is the restartable unit of STYLE.md 8: wait for ``kubelet.sock`` → serve our
socket → register → watch. When the kubelet restarts it deletes every socket in the folder and
creates a new ``kubelet.sock``; the unit notices (the socket's inode changes, or ours is gone)
within `poll_s`, stops serving, and starts over, without restarting the process. The plugin
serves before it registers, because the kubelet calls back during Register.

Our socket is created with umask 077 (owner-only): anyone able to write it could ask for
allocations. gRPC errors are produced here only: `Refusal` → FAILED_PRECONDITION with its
message (the kubelet puts it in the pod's status), API errors → UNAVAILABLE or INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from rocshare.kube.client import ApiError
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import deviceplugin_pb2_grpc as pb_grpc
from rocshare.api.resource_names import GPU_RESOURCE
from rocshare_agent.deviceplugin.inflight import Refusal
from rocshare_agent.deviceplugin.service import DevicePluginService

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_SOCKET_NAME = "rocshare-amdgpu.sock"
REGISTER_DELAYS_S = (0.2, 0.5, 1, 2, 5)
SOCKET_PATH_MAX_BYTES = 107
"""sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL."""


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """Binds the plain handlers to gRPC and translates their typed errors."""

    def __init__(self, service: DevicePluginService, resource: str = GPU_RESOURCE) -> None:
        self._service = service
        self._resource = resource

    async def GetDevicePluginOptions(self, request, context):  # noqa: N802 (gRPC names)
        return await self._service.get_device_plugin_options(request)

    async def ListAndWatch(self, request, context) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        async for response in self._service.list_and_watch(request, self._resource):
            yield response

    async def GetPreferredAllocation(self, request, context):  # noqa: N802
        return await self._service.get_preferred_allocation(request)

    async def Allocate(self, request, context):  # noqa: N802
        try:
            return await self._service.allocate(request)
        except Refusal as refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"rocshare: {refusal.message}")
        except ApiError as error:
            code = grpc.StatusCode.UNAVAILABLE if error.temporary else grpc.StatusCode.INTERNAL
            await context.abort(code, f"rocshare: API server: {error}")

    async def PreStartContainer(self, request, context):  # noqa: N802
        return await self._service.pre_start_container(request)


async def start_owner_only(server: grpc.aio.Server, socket: Path) -> None:
    """Serve on a fresh unix socket at `socket` that only its owner can open: bind() creates the
    file, so the umask is narrowed around it (anyone able to write it could ask for devices)."""
    if len(os.fsencode(socket)) > SOCKET_PATH_MAX_BYTES:
        raise ValueError(f"socket path {socket} is longer than a unix socket address holds "
                         f"({SOCKET_PATH_MAX_BYTES} bytes): choose a shorter folder")
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    previous = os.umask(0o077)
    try:
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
    finally:
        os.umask(previous)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def socket_name_for(resource: str) -> str:
    """rocshare-amdgpu.sock for amd.com/gpu; rocshare-<kind>.sock for a partition kind."""
    return DEFAULT_SOCKET_NAME if resource == GPU_RESOURCE else f"rocshare-{resource.removeprefix('amd.com/')}.sock"


class PluginUnit:
    def __init__(self, service: DevicePluginService, *, plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
                 resource: str = GPU_RESOURCE, poll_s: float = 0.5) -> None:
        self.service = service
        self.plugin_dir = Path(plugin_dir)
        self.resource = resource
        self.socket_name = socket_name_for(resource)
        self.poll_s = poll_s
        self.registrations = 0
        self.registered = asyncio.Event()  # set while registered with the current kubelet

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def run(self) -> None:
        while True:
            kubelet = await self._wait_for_kubelet()
            server = await self._serve()
            try:
                if await self._register(kubelet):
                    self.registrations += 1
                    self.registered.set()
                    log.info("registered %s with the kubelet at %s (registration %d)",
                             self.resource, self.kubelet_socket, self.registrations)
                    await self._watch(kubelet)
            finally:
                self.registered.clear()
                await server.stop(grace=0.5)
            self.service.reset_progress()
            log.info("kubelet socket re-created or ours removed: serving and registering again")

    async def _wait_for_kubelet(self) -> tuple[int, int, int]:
        while (identity := _identity(self.kubelet_socket)) is None:
            await asyncio.sleep(self.poll_s)
        return identity

    async def _serve(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(self.service, self.resource), server)
        await start_owner_only(server, self.socket_path)
        return server

    async def _register(self, kubelet: tuple[int, int, int]) -> bool:
        """Register, retrying; False when the kubelet socket changed meanwhile (start over)."""
        attempt = 0
        while _identity(self.kubelet_socket) == kubelet:
            try:
                await self._register_once()
                return True
            except grpc.aio.AioRpcError as error:
                delay_s = REGISTER_DELAYS_S[min(attempt, len(REGISTER_DELAYS_S) - 1)]
                attempt += 1
                log.warning("registration attempt %d failed: %s %s; retrying in %.1f s",
                            attempt, error.code().name, error.details(), delay_s)
                await asyncio.sleep(delay_s)
        return False

    async def _register_once(self) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION, endpoint=self.socket_name, resource_name=self.resource,
            options=await self.service.get_device_plugin_options(pb.Empty()))
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=10)

    async def _watch(self, kubelet: tuple[int, int, int]) -> None:
        while _identity(self.kubelet_socket) == kubelet and self.socket_path.exists():
            await asyncio.sleep(self.poll_s)


async def run_plugin_units(service: DevicePluginService, *, plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
                           poll_s: float = 0.5) -> None:
    """One PluginUnit per resource name the inventory is offered under (one, amd.com/gpu, unless a
    pool names partitions by kind), started and stopped as the names change; until cancelled."""
    units: dict[str, asyncio.Task] = {}
    changed: asyncio.Future | None = None
    try:
        while True:
            changed = asyncio.ensure_future(service.inventory_changed())  # before reading: no change slips by
            wanted = set(service.resources)
            for resource in sorted(set(units) - wanted):
                log.info("no device is offered as %s any more: its plugin stops", resource)
                units.pop(resource).cancel()
            for resource in sorted(wanted - set(units)):
                unit = PluginUnit(service, plugin_dir=plugin_dir, resource=resource, poll_s=poll_s)
                units[resource] = asyncio.create_task(unit.run(), name=f"device plugin {resource}")
            await changed
    finally:
        for task in [*units.values(), *([changed] if changed else [])]:
            task.cancel()
        await asyncio.gather(*units.values(), return_exceptions=True)
