"""dmem: the pod's VRAM cap written to dmem.max on a temp cgroup-like tree (region names read
from the root's dmem.capacity), and a clean skip where the node has no dmem."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.api.models import GpuInfo, Partition
from rocshare_agent.deviceplugin import dmem
from tests.agent_fakes import hook_present

MIB = 1 << 20
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def gpu(index: int, *, partition: Partition | None = None) -> GpuInfo:
    return GpuInfo(id=f"G{index}", index=index, render_minor=128 + index, gfx_target_version=90402, cu_count=38,
                   pci_bdf=f"0000:{0x83 + index:02x}:00.0", partition=partition, split_count=10, healthy=True)


GPUS = {g.id: g for g in [gpu(0), gpu(1),
                          gpu(2, partition=Partition(compute_mode="cpx", index=1, parent_bdf="0000:83:00.0"))]}


def record() -> AllocationRecord:
    return AllocationRecord(node="n", containers=[
        ContainerAllocation(name="a", devices=[DeviceSlice(gpu_id="G0", memory_mib=1024, cu_count=1),
                                               DeviceSlice(gpu_id="G1", memory_mib=99, cu_count=1, whole=True)]),
        ContainerAllocation(name="b", devices=[DeviceSlice(gpu_id="G0", memory_mib=512, cu_count=1),
                                               DeviceSlice(gpu_id="G2", memory_mib=256, cu_count=1)]),
    ])


def cgroup_tree(root: Path, *, systemd: bool) -> Path:
    (root / "dmem.capacity").write_text("drm/0000:83:00.0/vram0 68702699520\ndrm/0000:84:00.0/vram0 68702699520\n"
                                        "drm/0000:83:00.0/gtt 1000\n")
    if systemd:
        pod = root / "kubepods.slice" / "kubepods-burstable.slice" / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    else:
        pod = root / "kubepods" / "besteffort" / f"pod{UID}"
    pod.mkdir(parents=True)
    (pod / "dmem.max").write_text("")
    return pod


def test_caps_sum_slices_per_physical_gpu_and_skip_whole_gpus():
    assert dmem.vram_caps_bytes(record(), GPUS) == {"0000:83:00.0": (1024 + 512 + 256) * MIB}


def test_region_names_come_from_capacity_vram_only(tmp_path: Path):
    cgroup_tree(tmp_path, systemd=False)
    limits = dmem.region_limits(dmem.read_regions(tmp_path), dmem.vram_caps_bytes(record(), GPUS))
    assert limits == {"drm/0000:83:00.0/vram0": 1792 * MIB}


async def test_writes_dmem_max_once_the_pod_cgroup_appears(tmp_path: Path):
    for systemd in (False, True):  # both kubelet cgroup drivers
        root = tmp_path / ("systemd" if systemd else "cgroupfs")
        root.mkdir()
        pod = cgroup_tree(root, systemd=systemd)
        assert dmem.find_pod_cgroup(root, UID) == pod
        assert await dmem.apply_when_ready(root, UID, {"drm/0000:83:00.0/vram0": 5 * MIB}, timeout_s=2, poll_s=0.01)
        assert (pod / "dmem.max").read_text() == f"drm/0000:83:00.0/vram0 {5 * MIB}\n"


async def test_waits_for_a_cgroup_created_after_allocate(tmp_path: Path):
    (tmp_path / "dmem.capacity").write_text("drm/0000:83:00.0/vram0 1\n")
    waiting = asyncio.create_task(dmem.apply_when_ready(tmp_path, UID, {"drm/0000:83:00.0/vram0": 7}, timeout_s=5, poll_s=0.01))
    await asyncio.sleep(0.05)
    pod = tmp_path / "kubepods" / f"pod{UID}"
    pod.mkdir(parents=True)
    (pod / "dmem.max").write_text("")
    assert await waiting
    assert (pod / "dmem.max").read_text() == "drm/0000:83:00.0/vram0 7\n"


async def test_no_dmem_is_skipped_cleanly(tmp_path: Path):
    assert not dmem.dmem_available(tmp_path)
    assert await dmem.apply_when_ready(tmp_path, UID, {"r": 1}, timeout_s=0.05, poll_s=0.01) is False


async def test_allocate_caps_the_served_pod(tmp_path: Path):
    from rocshare.api.allocation import ALLOCATION_ANNOTATION, encode_record
    from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
    from rocshare_agent.deviceplugin.service import DevicePluginService

    pod_cgroup = cgroup_tree(tmp_path, systemd=True)
    rec = AllocationRecord(node="n", containers=[
        ContainerAllocation(name="a", devices=[DeviceSlice(gpu_id="G1", memory_mib=3000, cu_count=1)])])
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": UID, "annotations": {ALLOCATION_ANNOTATION: encode_record(rec)}},
           "spec": {"nodeName": "n", "containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
           "status": {"phase": "Pending"}}

    class OnePod:
        def cached(self):
            return [pod]

        async def next_event(self, timeout_s):
            return False

        async def fresh(self):
            return [pod]

        async def mark_refused(self, ref, reason):
            raise AssertionError(reason)

    service = DevicePluginService(node_name="n", pods=OnePod(), hook_host_dir="/h", cgroup_root=tmp_path,
                                  hook_check=hook_present)
    service.set_inventory(list(GPUS.values()))
    await service.allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])]))
    await service.settle()
    assert (pod_cgroup / "dmem.max").read_text() == f"drm/0000:84:00.0/vram0 {3000 * MIB}\n"
