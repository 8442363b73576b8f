"""CDI on the real node: a device handed to a container through a CDI spec, by the real kubelet
and the real container runtime -- what DRA relies on (a DRA driver's prepare returns CDI device
names; the kubelet passes them to the runtime in the CRI's CDIDevices, the same field it fills
from a device plugin's Allocate answer).

The test writes a CDI spec of its own (vendor `cdi-test.rocshare.dev`, a fake device adding an
env var, a device node and a bind mount, each carrying a token made up for this run) into
/var/run/cdi, serves a minimal device plugin whose Allocate names that CDI device, and runs a pod
that asks for it. The container reports what it really received.

On the default rig (containerd 2.x, CDI on; `ROCSHARE_REALNODE_RUNTIME=containerd2`) it must
receive all three. On `ROCSHARE_REALNODE_RUNTIME=containerd` (Debian's containerd 1.6, which
predates the CRI's CDIDevices) it must receive none of them: the kubelet asks, the runtime
ignores it -- why DRA needs containerd 2.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import deviceplugin_pb2_grpc as pb_grpc
from rocshare_dev.realnode.kubelet import DEVICE_PLUGIN_DIR
from tests.realnode.conftest import RUNTIME, describe, wait_for

VENDOR_CLASS = "cdi-test.rocshare.dev/fake"
CDI_DEVICE = f"{VENDOR_CLASS}=dev0"
SPEC_FILE = Path("/var/run/cdi/rocshare-cdi-test.yaml")
SOCKET = DEVICE_PLUGIN_DIR / "rocshare-cdi-test.sock"  # rocshare-*.sock: the rig's down removes it too
CONTAINER_DEVICE = "/dev/rocshare-cdi-test0"
CONTAINER_FILE = "/run/rocshare-cdi-test/token"
NAMESPACE = "cdi-test"


class FakeDevicePlugin(pb_grpc.DevicePluginServicer):
    """One healthy device; Allocate answers with the CDI device name only (no env, mounts or
    device specs of its own), so whatever the container gets came through CDI."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.allocations: list[list[str]] = []

    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="dev0", health="Healthy")])
        self.stopped.wait()

    def Allocate(self, request, context):
        self.allocations.extend(list(container.devices_ids) for container in request.container_requests)
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=CDI_DEVICE)])
            for _ in request.container_requests])

    def GetPreferredAllocation(self, request, context):
        return pb.PreferredAllocationResponse()

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


def cdi_spec(token: str, host_device: Path, host_file: Path) -> dict:
    return {"cdiVersion": "0.6.0", "kind": VENDOR_CLASS, "devices": [{
        "name": "dev0",
        "containerEdits": {
            "env": [f"ROCSHARE_CDI_TOKEN={token}"],
            "deviceNodes": [{"path": CONTAINER_DEVICE, "hostPath": str(host_device)}],
            "mounts": [{"hostPath": str(host_file), "containerPath": CONTAINER_FILE, "options": ["ro", "bind"]}],
        }}]}


@pytest.fixture
def cdi_device(real_node, tmp_path) -> Iterator[dict]:
    token = secrets.token_hex(8)
    host_device = tmp_path / "fake-dev"
    os.mknod(host_device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device (null's numbers)
    host_file = tmp_path / "token"
    host_file.write_text(token + "\n")
    SPEC_FILE.parent.mkdir(parents=True, exist_ok=True)
    SPEC_FILE.write_text(yaml.safe_dump(cdi_spec(token, host_device, host_file)))
    plugin = FakeDevicePlugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DevicePluginServicer_to_server(plugin, server)
    SOCKET.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{SOCKET}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{DEVICE_PLUGIN_DIR / 'kubelet.sock'}") as channel:
            pb_grpc.RegistrationStub(channel).Register(pb.RegisterRequest(
                version="v1beta1", endpoint=SOCKET.name, resource_name=VENDOR_CLASS), timeout=10)
        yield {"token": token, "plugin": plugin}
    finally:
        plugin.stopped.set()
        server.stop(grace=1).wait()
        SOCKET.unlink(missing_ok=True)
        SPEC_FILE.unlink(missing_ok=True)


def pod_manifest() -> dict:
    report = (f'echo "env=$ROCSHARE_CDI_TOKEN"; '
              f'echo "device=$(stat -c %F:%t:%T {CONTAINER_DEVICE} 2>&1)"; '
              f'echo "file=$(cat {CONTAINER_FILE} 2>&1)"; echo done; sleep 3600')
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cdi-probe", "namespace": NAMESPACE},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [{
                "name": "probe", "image": "localhost/rocshare/workload:dev", "imagePullPolicy": "Never",
                "command": ["sh", "-c", report],
                "resources": {"limits": {VENDOR_CLASS: "1"}}}]}}


def test_a_cdi_device_reaches_the_container_through_the_kubelet_and_runtime(real_node, cdi_device):
    cluster = real_node.control_plane
    wait_for(f"the node to offer {VENDOR_CLASS}", lambda: json.loads(cluster.kubectl(
        "get", "node", real_node.node_name, "-o", "json").stdout)["status"].get("allocatable", {}).get(VENDOR_CLASS)
        == "1", timeout_s=60)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod_manifest()))
    try:
        logs = wait_for("the probe's report", lambda: _report(cluster), timeout_s=180,
                        explain=lambda: describe(cluster, f"pod -n {NAMESPACE} cdi-probe"))
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    assert cdi_device["plugin"].allocations == [["dev0"]]  # the kubelet asked our plugin, once
    token = cdi_device["token"]
    if RUNTIME == "containerd2":
        assert logs["env"] == token
        assert logs["device"] == "character special file:1:3"
        assert logs["file"] == token
    else:  # Debian's containerd 1.6: the kubelet passes the CDI device, the runtime drops it
        assert logs["env"] == ""
        assert "No such file" in logs["device"]
        assert "No such file" in logs["file"]


def _report(cluster) -> dict[str, str] | None:
    got = cluster.kubectl("logs", "-n", NAMESPACE, "cdi-probe", check=False)
    if got.returncode != 0 or "done" not in got.stdout.split():
        return None
    return dict(line.split("=", 1) for line in got.stdout.splitlines() if "=" in line)
