"""Non-root containers: the agent hands them device files they can open (pod_devices.py), and
publishes the node's video and render group ids (host_groups.py). Pure rules as tables; the
device files are real character devices made in a temp folder (the tests run as root, as the
agent does), and Allocate is called through the service with an in-memory pod source."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.models import GpuInfo
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin.pod_devices import Identity, PodDeviceDir, container_identity, owner_and_mode
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.host_groups import parse_device_groups
from tests.agent_fakes import MemoryPods, hook_present

NODE = "node-a"
RENDER_GID = 992


def test_device_groups_from_a_group_file() -> None:
    text = "root:x:0:\nvideo:x:44:alice\nrender:x:992:\nbroken line\nrender:x:5:dup\n"
    assert [(g.name, g.gid) for g in parse_device_groups(text)] == [("video", 44), ("render", 992)]
    assert parse_device_groups("root:x:0:\n") == []


@pytest.mark.parametrize(("pod_context", "container_context", "expected"), [
    ({}, {}, None),
    ({"runAsUser": 0}, {}, None),
    ({"runAsUser": 1000}, {}, Identity(1000, None)),
    ({"runAsUser": 1000, "runAsGroup": 3000}, {}, Identity(1000, 3000)),
    ({"runAsUser": 1000}, {"runAsUser": 0}, None),  # the container's own context wins
    ({}, {"runAsUser": 2000, "runAsGroup": 2000}, Identity(2000, 2000)),
    ({"runAsNonRoot": True}, {}, Identity(None, None)),  # the image's user: unknown here
])
def test_container_identity(pod_context, container_context, expected) -> None:
    pod = {"spec": {"securityContext": pod_context,
                    "containers": [{"name": "main", "securityContext": container_context}]}}
    assert container_identity(pod, "main") == expected


def test_owner_and_mode() -> None:
    assert owner_and_mode(Identity(1000, 3000), RENDER_GID) == (1000, 3000, 0o660)
    assert owner_and_mode(Identity(1000, None), RENDER_GID) == (1000, RENDER_GID, 0o660)
    assert owner_and_mode(Identity(None, None), RENDER_GID) == (0, RENDER_GID, 0o666)


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    """Real character devices, root:render 0660, as on a GPU node (major 1 minor 3: /dev/null's)."""
    root = tmp_path / "dev"
    (root / "dri").mkdir(parents=True)
    for path in (root / "kfd", root / "dri" / "renderD128"):
        os.mknod(path, stat.S_IFCHR | 0o660, os.makedev(1, 3))
        os.chown(path, 0, RENDER_GID)
    return root


def _pod(security: dict) -> dict:
    record = AllocationRecord(node=NODE, containers=[ContainerAllocation(name="main", devices=[
        DeviceSlice(gpu_id="GPU-0000000000000000", memory_mib=2048, cu_count=52, cu_ranges=[(0, 51)])])])
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}},
            "spec": {"nodeName": NODE, "securityContext": security,
                     "containers": [{"name": "main", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


async def _allocate(pod: dict, dev_root: Path, pod_device_dir: Path) -> pb.ContainerAllocateResponse:
    source = MemoryPods([pod])
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir="/opt/vgpu", hook_check=hook_present, dev_root=str(dev_root),
                                  pod_device_dir=pod_device_dir)
    service.set_inventory([GpuInfo(id="GPU-0000000000000000", index=0, render_minor=128, gfx_target_version=90010,
                                   cu_count=104, pci_bdf="0000:00:00.0", split_count=2, healthy=True)])
    reply = await service.allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=["x0"])]))
    await service.settle()
    return reply.container_responses[0]


async def test_a_non_root_container_gets_device_files_its_user_owns(dev_root: Path, tmp_path: Path) -> None:
    response = await _allocate(_pod({"runAsUser": 1000, "runAsGroup": 3000}), dev_root, tmp_path / "pod-devices")
    assert [d.container_path for d in response.devices] == ["/dev/kfd", "/dev/dri/renderD128"]
    for device in response.devices:
        assert device.host_path.startswith(str(tmp_path / "pod-devices" / "uid-p" / "main"))
        made = os.stat(device.host_path)
        assert stat.S_ISCHR(made.st_mode) and made.st_rdev == os.makedev(1, 3)
        assert (made.st_uid, made.st_gid, stat.S_IMODE(made.st_mode)) == (1000, 3000, 0o660)
    with open(response.devices[1].host_path, "rb"):  # it is still the same device
        pass


async def test_a_root_container_gets_the_hosts_device_files(dev_root: Path, tmp_path: Path) -> None:
    response = await _allocate(_pod({}), dev_root, tmp_path / "pod-devices")
    assert [d.host_path for d in response.devices] == [str(dev_root / "kfd"), str(dev_root / "dri" / "renderD128")]
    assert not (tmp_path / "pod-devices" / "uid-p").exists()


async def test_device_files_go_with_their_pod(dev_root: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pod-devices"
    await _allocate(_pod({"runAsUser": 1000}), dev_root, folder)
    directory = PodDeviceDir(folder)
    assert directory.forget_all_but(["uid-p"]) == [] and (folder / "uid-p").is_dir()
    assert directory.forget_all_but([]) == ["uid-p"] and not (folder / "uid-p").exists()
