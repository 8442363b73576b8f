"""The real-node kubelet registers DRA kubelet plugins from /var/lib/kubelet/plugins_registry
(the folder DRA drivers' DaemonSets mount), which the rig bind-mounts onto the kubelet's own
`<root dir>/plugins_registry` (dev/rocshare_dev/realnode/kubelet.py).

The test plays a DRA driver's registration side only: a socket in that folder serving the
kubelet's plugin-registration API (package `pluginregistration`: GetInfo, then
NotifyRegistrationStatus). The kubelet's own answer is the evidence: a plugin offering the DRA
gRPC service the kubelet speaks (`v1.DRAPlugin`) is told it is registered; one offering only a
service no kubelet speaks is told it is not, with the kubelet's reason. The messages are built
here from their public field numbers in a descriptor pool of the test's own (no generated
module, so nothing clashes with the agent's).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from rocshare_dev.realnode.kubelet import PLUGINS_REGISTRY_DIR

PACKAGE = "pluginregistration"
DRA_SERVICE_V1 = "v1.DRAPlugin"


def _registration_messages() -> dict[str, type]:
    """InfoRequest {}, PluginInfo {type=1, name=2, endpoint=3, repeated supported_versions=4},
    RegistrationStatus {plugin_registered=1, error=2}, RegistrationStatusResponse {}."""
    string, boolean = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
    optional, repeated = (descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                          descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    shapes = {
        "InfoRequest": [],
        "PluginInfo": [("type", 1, string, optional), ("name", 2, string, optional), ("endpoint", 3, string, optional),
                       ("supported_versions", 4, string, repeated)],
        "RegistrationStatus": [("plugin_registered", 1, boolean, optional), ("error", 2, string, optional)],
        "RegistrationStatusResponse": [],
    }
    file = descriptor_pb2.FileDescriptorProto(name="rocshare_test_pluginregistration.proto", package=PACKAGE,
                                              syntax="proto3")
    for name, fields in shapes.items():
        message = file.message_type.add(name=name)
        for field, number, kind, label in fields:
            message.field.add(name=field, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in shapes}


MESSAGES = _registration_messages()


class RegistrationSide:
    """A plugin's registration socket: answers GetInfo with `info`, queues what the kubelet
    reports back through NotifyRegistrationStatus."""

    def __init__(self, socket: Path, *, driver: str, versions: list[str]) -> None:
        self.socket = socket
        self.info = MESSAGES["PluginInfo"](type="DRAPlugin", name=driver, endpoint=str(socket),
                                           supported_versions=versions)
        self.statuses: queue.Queue = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handlers = {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                lambda request, context: self.info, request_deserializer=MESSAGES["InfoRequest"].FromString,
                response_serializer=MESSAGES["PluginInfo"].SerializeToString),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self._notify, request_deserializer=MESSAGES["RegistrationStatus"].FromString,
                response_serializer=MESSAGES["RegistrationStatusResponse"].SerializeToString),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(f"{PACKAGE}.Registration",
                                                                                    handlers),))

    def _notify(self, status, context):
        self.statuses.put(status)
        return MESSAGES["RegistrationStatusResponse"]()

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=0).wait()
        self.socket.unlink(missing_ok=True)


@pytest.fixture
def plugins(real_node) -> Iterator[dict[str, RegistrationSide]]:
    sides = {
        "speaks v1": RegistrationSide(PLUGINS_REGISTRY_DIR / "rocshare-test-dra-v1-reg.sock",
                                      driver="v1.test.rocshare.dev", versions=[DRA_SERVICE_V1]),
        "speaks none": RegistrationSide(PLUGINS_REGISTRY_DIR / "rocshare-test-dra-v0-reg.sock",
                                        driver="v0.test.rocshare.dev", versions=["v0.NoSuchPlugin"]),
    }
    try:
        for side in sides.values():
            side.start()
        yield sides
    finally:
        for side in sides.values():
            side.stop()


def test_the_kubelet_registers_a_dra_plugin_from_the_standard_folder(plugins):
    accepted = plugins["speaks v1"].statuses.get(timeout=60)
    assert accepted.plugin_registered, accepted.error
    refused = plugins["speaks none"].statuses.get(timeout=60)
    assert not refused.plugin_registered
    assert "v0.NoSuchPlugin" in refused.error and DRA_SERVICE_V1 in refused.error  # the kubelet's own reason
