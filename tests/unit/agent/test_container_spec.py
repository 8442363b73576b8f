"""container_spec: the env, device nodes and mounts a container receives (DESIGN.md section 4).
Table tests on hand-built GpuInfo and records; pure, no I/O."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import ContainerAllocation, DeviceSlice
from rocshare.api.container_env import HANDED_OVER_NAMES, is_handed_over
from rocshare.api.models import GpuInfo, Partition
from rocshare_agent.deviceplugin.container_spec import (
    HOOK_CONTAINER_PATH,
    DeviceNode,
    Mount,
    SpecError,
    render_container,
)


def gpu(index: int, *, uid: str | None = None, card: int | None = None, partition: Partition | None = None) -> GpuInfo:
    return GpuInfo(id=uid or f"GPU-{index:016x}", index=index, render_minor=128 + index, card=card,
                   gfx_target_version=90010, cu_count=104, pci_bdf=f"0000:{index:02x}:00.0", split_count=10, healthy=True)


GPUS = {g.id: g for g in [gpu(0, card=1), gpu(1), gpu(2, uid="GPU-pci-0000-02-00-0")]}


def slice_(gpu_id: str, memory_mib: int, ranges=(), *, whole: bool = False) -> DeviceSlice:
    return DeviceSlice(gpu_id=gpu_id, memory_mib=memory_mib, cu_ranges=list(ranges), cu_count=104, whole=whole)


def render(devices, *, oversubscribed: bool = False):
    container = ContainerAllocation(name="main", devices=devices)
    return render_container(container, GPUS, oversubscribed=oversubscribed, hook_host_dir="/opt/vgpu", dev_root="/dev")


CASES = [
    pytest.param(
        [slice_("GPU-0000000000000000", 4096, [(0, 51)])],
        False,
        {"ROCR_VISIBLE_DEVICES": "GPU-0000000000000000", "HIP_VISIBLE_DEVICES": "0", "HSA_CU_MASK": "0:0-51",
         "HIP_DEVICE_MEMORY_LIMIT_0": "4096m", "LD_AUDIT": HOOK_CONTAINER_PATH},
        id="one slice with a CU mask",
    ),
    pytest.param(
        [slice_("GPU-0000000000000001", 1024), slice_("GPU-0000000000000000", 2048, [(10, 19), (30, 39)])],
        True,
        {"ROCR_VISIBLE_DEVICES": "GPU-0000000000000001,GPU-0000000000000000", "HIP_VISIBLE_DEVICES": "0,1",
         "HSA_CU_MASK": "1:10-19,30-39", "HIP_DEVICE_MEMORY_LIMIT_0": "1024m", "HIP_DEVICE_MEMORY_LIMIT_1": "2048m",
         "LD_AUDIT": HOOK_CONTAINER_PATH, "HIP_OVERSUBSCRIBE": "true", "HSA_XNACK": "1"},
        id="two slices, record order, scaled VRAM (CDNA: XNACK on)",
    ),
    pytest.param(
        [slice_("GPU-0000000000000000", 65520, whole=True), slice_("GPU-0000000000000001", 65520, whole=True)],
        True,
        {"ROCR_VISIBLE_DEVICES": "GPU-0000000000000000,GPU-0000000000000001", "HIP_VISIBLE_DEVICES": "0,1"},
        id="whole GPUs: no hook, no limits, no oversubscribe",
    ),
    pytest.param(
        [slice_("GPU-0000000000000000", 65520, whole=True), slice_("GPU-0000000000000001", 512)],
        False,
        {"ROCR_VISIBLE_DEVICES": "GPU-0000000000000000,GPU-0000000000000001", "HIP_VISIBLE_DEVICES": "0,1",
         "HIP_DEVICE_MEMORY_LIMIT_1": "512m", "LD_AUDIT": HOOK_CONTAINER_PATH},
        id="a whole GPU next to a slice: only the slice is limited",
    ),
    pytest.param(
        [slice_("GPU-pci-0000-02-00-0", 512), slice_("GPU-0000000000000001", 512)],
        False,
        {"ROCR_VISIBLE_DEVICES": "1,GPU-0000000000000001", "HIP_VISIBLE_DEVICES": "0,1",
         "HIP_DEVICE_MEMORY_LIMIT_0": "512m", "HIP_DEVICE_MEMORY_LIMIT_1": "512m", "LD_AUDIT": HOOK_CONTAINER_PATH},
        id="no ROCr UUID: named by its KFD-order index inside the container",
    ),
]


@pytest.mark.parametrize(("devices", "oversubscribed", "envs"), CASES)
def test_envs(devices, oversubscribed, envs):
    assert render(devices, oversubscribed=oversubscribed).envs == envs


def test_device_nodes_kfd_once_then_card_and_render_per_gpu():
    spec = render([slice_("GPU-0000000000000000", 1), slice_("GPU-0000000000000001", 1)])
    assert spec.devices == [
        DeviceNode("/dev/kfd", "/dev/kfd"),
        DeviceNode("/dev/dri/card1", "/dev/dri/card1"),
        DeviceNode("/dev/dri/renderD128", "/dev/dri/renderD128"),
        DeviceNode("/dev/dri/renderD129", "/dev/dri/renderD129"),
    ]
    assert all(node.permissions == "rw" for node in spec.devices)


def test_host_paths_follow_dev_root():
    container = ContainerAllocation(name="c", devices=[slice_("GPU-0000000000000001", 1)])
    spec = render_container(container, GPUS, oversubscribed=False, hook_host_dir="/h", dev_root="/tmp/node/dev")
    assert [n.host_path for n in spec.devices] == ["/tmp/node/dev/kfd", "/tmp/node/dev/dri/renderD129"]
    assert [n.container_path for n in spec.devices] == ["/dev/kfd", "/dev/dri/renderD129"]


def test_slices_mount_the_hook_read_only_and_whole_gpus_do_not():
    assert render([slice_("GPU-0000000000000000", 1)]).mounts == [Mount("/opt/vgpu/libamvgpu.so", HOOK_CONTAINER_PATH, True)]
    assert render([slice_("GPU-0000000000000000", 1, whole=True)]).mounts == []


def test_unknown_gpu_is_an_error_naming_it():
    with pytest.raises(SpecError, match="GPU-ffffffffffffffff is not on this node"):
        render([slice_("GPU-ffffffffffffffff", 1)])


def test_container_spec_env_is_all_handed_over() -> None:
    """No drift: every variable the agent renders (both oversubscription branches, slices and whole
    GPUs) is one admission protects, and every protected name is one the agent can set."""
    gpus = {f"GPU-{i:016x}": GpuInfo(id=f"GPU-{i:016x}", index=i, render_minor=128 + i, card=None,
                                    gfx_target_version=90010, cu_count=104, pci_bdf=f"0000:0{i}:00.0",
                                    split_count=10, healthy=True) for i in range(2)}
    rendered: set[str] = set()
    for oversubscribed in (False, True):
        devices = [DeviceSlice(gpu_id="GPU-0000000000000000", memory_mib=512, cu_ranges=[(0, 9)], cu_count=104),
                   DeviceSlice(gpu_id="GPU-0000000000000001", memory_mib=512, cu_ranges=[], cu_count=104)]
        spec = render_container(ContainerAllocation(name="c", devices=devices), gpus, oversubscribed=oversubscribed,
                                hook_host_dir="/opt/vgpu")
        rendered |= set(spec.envs)
    assert all(is_handed_over(name) for name in rendered), rendered
    assert set(HANDED_OVER_NAMES) <= rendered
