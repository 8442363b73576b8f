"""The DRA kubelet plugin on its unix sockets: the DRA service and the registration service.

The kubelet discovers plugins by the sockets in its ``plugins_registry`` folder: it calls
``GetInfo`` on ours (type DRAPlugin, the driver name, the DRA socket's path, the services served
there: ``v1.DRAPlugin``) and then ``NotifyRegistrationStatus``; from then on it calls
NodePrepareResources/NodeUnprepareResources on the DRA socket. The DRA socket is served before
the registration socket appears, so the kubelet never finds an endpoint that does not answer.
Both sockets are created owner-only (umask 077): anyone able to write them could prepare claims.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from rocshare.api import dra
from rocshare_agent.deviceplugin.server import start_owner_only
from rocshare_agent.dra import dra_pb2_grpc as dra_grpc
from rocshare_agent.dra import registration_pb2 as reg_pb
from rocshare_agent.dra import registration_pb2_grpc as reg_grpc
from rocshare_agent.dra.plugin import DraPluginService

log = logging.getLogger(__name__)

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DRA_SERVICE = "v1.DRAPlugin"
PLUGIN_TYPE = "DRAPlugin"


class DraServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, service: DraPluginService) -> None:
        self._service = service

    async def NodePrepareResources(self, request, context):  # noqa: N802 (gRPC names)
        return await self._service.node_prepare_resources(request)

    async def NodeUnprepareResources(self, request, context):  # noqa: N802
        return await self._service.node_unprepare_resources(request)


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = asyncio.Event()

    async def GetInfo(self, request, context):  # noqa: N802
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=dra.DRIVER_NAME, endpoint=str(self.endpoint),
                                 supported_versions=[DRA_SERVICE])

    async def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", dra.DRIVER_NAME)
            self.registered.set()
        else:
            log.error("the kubelet refused DRA driver %s: %s", dra.DRIVER_NAME, request.error)
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()


def plugin_socket(plugins_dir: Path) -> Path:
    return Path(plugins_dir) / dra.DRIVER_NAME / "dra.sock"


def registration_socket(registry_dir: Path) -> Path:
    return Path(registry_dir) / f"{dra.DRIVER_NAME}-reg.sock"


async def serve_dra_plugin(service: DraPluginService, *, plugins_dir: Path | str = DEFAULT_PLUGINS_DIR,
                           registry_dir: Path | str = DEFAULT_REGISTRY_DIR) -> None:
    """Serve both sockets until cancelled."""
    endpoint = plugin_socket(Path(plugins_dir))
    dra_server = grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(DraServicer(service), dra_server)
    registration_server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(RegistrationServicer(endpoint), registration_server)
    await start_owner_only(dra_server, endpoint)
    await start_owner_only(registration_server, registration_socket(Path(registry_dir)))
    log.info("DRA driver %s serving %s", dra.DRIVER_NAME, endpoint)
    try:
        await asyncio.Event().wait()
    finally:
        await registration_server.stop(grace=0.5)
        await dra_server.stop(grace=0.5)
