"""The monitor's collector on temp trees: KFD per-process VRAM mapped to pods through
/proc/<pid>/cgroup (a synthetic proc root) and the node's pods (container statuses, or the
allocation record), limits from the environment, CU occupancy, host sensors; HAMi's labels."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare_agent.monitor import ContainerRef, GpuMetricsCollector, container_name, parse_cgroup, parse_limit_bytes

UID = "3f9c2a1e-1b2c-4d5e-8f90-123456789abc"
CID = "a" * 64


def test_parse_cgroup_layouts():
    systemd = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    cgroupfs = f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n"
    crio = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope"
    for text in (systemd, cgroupfs, crio):
        assert parse_cgroup(text) == ContainerRef(UID, CID)
    assert parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n") is None
    assert parse_cgroup(f"0::/kubepods/pod{UID}\n") is None  # the pod's own cgroup, no container


def test_parse_limit():
    assert parse_limit_bytes("4096m") == 4096 * 2**20
    assert parse_limit_bytes("2g") == 2 * 2**30 and parse_limit_bytes("123") == 123 and parse_limit_bytes("lots") is None


def _process(sysfs: Path, proc: Path, pid: int, vram: dict[int, int], cgroup: str, environ: dict[str, str],
             cu_busy: dict[int, int] | None = None) -> None:
    kfd = sysfs / "class/kfd/kfd/proc" / str(pid)
    kfd.mkdir(parents=True)
    for gpu_id, used in vram.items():
        (kfd / f"vram_{gpu_id}").write_text(f"{used}\n")
    for gpu_id, busy in (cu_busy or {}).items():
        (kfd / f"stats_{gpu_id}").mkdir()
        (kfd / f"stats_{gpu_id}" / "cu_occupancy").write_text(f"{busy}\n")
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


GPU = "GPU-c34ec50444dd0a6c"


def _pod(uid: str, *, statuses: dict[str, str], record: AllocationRecord | None = None) -> dict:
    annotations = {ALLOCATION_ANNOTATION: encode_record(record)} if record else {}
    return {"metadata": {"uid": uid, "namespace": "team", "name": "trainer", "annotations": annotations},
            "status": {"containerStatuses": [{"name": name, "containerID": cid} for name, cid in statuses.items()]}}


def _record(*containers: str) -> AllocationRecord:
    return AllocationRecord(node="n1", containers=[
        ContainerAllocation(name=name, devices=[DeviceSlice(gpu_id=GPU, memory_mib=1024, cu_ranges=[(0, 15)], cu_count=16)])
        for name in containers])


def _collector(sysfs: Path, proc: Path, pods: list[dict]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=proc, node_name="n1", pods=lambda: pods))
    return registry


def test_collector_on_a_temp_tree(copy_capture, tmp_path):
    sysfs = copy_capture("vega10-1gpu")
    proc = tmp_path / "proc"
    env = {"ROCR_VISIBLE_DEVICES": GPU, "HIP_DEVICE_MEMORY_LIMIT_0": "1024m"}
    _process(sysfs, proc, 100, {13261: 1000}, f"0::/kubepods/burstable/pod{UID}/{CID}\n", env, cu_busy={13261: 8})
    _process(sysfs, proc, 101, {13261: 500}, f"0::/kubepods/burstable/pod{UID}/{CID}\n", env, cu_busy={13261: 8})
    _process(sysfs, proc, 102, {13261: 7}, "0::/system.slice/sshd.service\n", {})  # not a pod: skipped
    _process(sysfs, proc, 103, {99999: 7}, f"0::/kubepods/pod{UID}/{'b' * 64}\n", {})  # unknown GPU: skipped
    _process(sysfs, proc, 104, {13261: 9}, f"0::/kubepods/pod{'0' * 8}-0000-0000-0000-{'0' * 12}/{CID}\n", {})  # unknown pod
    registry = _collector(sysfs, proc, [_pod(UID, statuses={"main": f"containerd://{CID}"})])
    labels = {"namespace": "team", "pod": "trainer", "container": "main", "vdevice_index": "0",
              "device_uuid": GPU, "zone": "vGPU"}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", labels) == 1500
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 1024 * 2**20
    assert registry.get_sample_value("hami_container_device_utilization_ratio", labels) == 25.0  # 16 of 64 CUs
    families = {family.name: family for family in registry.collect()}
    assert len(families["hami_vgpu_memory_used_bytes"].samples) == 1


def test_two_containers_of_one_pod_on_one_gpu_are_two_series(copy_capture, tmp_path):
    sysfs = copy_capture("vega10-1gpu")
    proc = tmp_path / "proc"
    other = "c" * 64
    _process(sysfs, proc, 100, {13261: 100}, f"0::/kubepods/pod{UID}/{CID}\n", {"ROCR_VISIBLE_DEVICES": GPU})
    _process(sysfs, proc, 101, {13261: 200}, f"0::/kubepods/pod{UID}/{other}\n", {"ROCR_VISIBLE_DEVICES": GPU})
    pod = _pod(UID, statuses={"a": f"containerd://{CID}", "b": f"cri-o://{other}"}, record=_record("a", "b"))
    registry = _collector(sysfs, proc, [pod])
    base = {"namespace": "team", "pod": "trainer", "vdevice_index": "0", "device_uuid": GPU, "zone": "vGPU"}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", {**base, "container": "a"}) == 100
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", {**base, "container": "b"}) == 200


def test_container_name_falls_back_to_the_record_only_when_it_is_unambiguous():
    one = _pod(UID, statuses={"main": "sim://x/main"}, record=_record("main"))
    two = _pod(UID, statuses={"a": "sim://x/a", "b": "sim://x/b"}, record=_record("a", "b"))
    assert container_name(one, CID, GPU) == ("main", [GPU])
    assert container_name(two, CID, GPU) is None
    assert container_name(_pod(UID, statuses={}), CID, GPU) is None


def test_whole_gpu_limit_is_its_vram(copy_capture, tmp_path):
    sysfs = copy_capture("vega10-1gpu")
    proc = tmp_path / "proc"
    _process(sysfs, proc, 100, {13261: 1}, f"0::/kubepods/pod{UID}/{CID}\n", {"ROCR_VISIBLE_DEVICES": GPU})
    registry = _collector(sysfs, proc, [_pod(UID, statuses={"main": f"docker://{CID}"})])
    labels = {"namespace": "team", "pod": "trainer", "container": "main", "vdevice_index": "0",
              "device_uuid": GPU, "zone": "vGPU"}
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 16368 * 2**20


def test_host_metrics_from_the_strix_capture(sysfs, tmp_path):
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs / "strixpoint-apu", proc_root=tmp_path, node_name="apu"))
    hami = {"node": "apu", "device_index": "0", "device_uuid": "GPU-pci-0000-c1-00-0",
            "device_type": "AMD Radeon 880M Graphics", "zone": "vGPU"}
    own = {**{k: v for k, v in hami.items() if k != "zone"}, "pci_bdf": "0000:c1:00.0"}
    assert registry.get_sample_value("hami_host_gpu_memory_used_bytes", hami) == 514580480
    assert registry.get_sample_value("hami_host_gpu_utilization_ratio", hami) == 3.0  # percent, as HAMi
    assert registry.get_sample_value("rocshare_host_gpu_temperature_celsius", own) == 38.0
    assert registry.get_sample_value("rocshare_host_gpu_power_usage_watts", own) == 9.087  # power1_input on APUs


def test_gpus_named_by_rank_find_their_limit():
    """Partitions and APUs have no ROCr UUID: the agent names them by their rank in KFD order among
    the container's GPUs (container_spec._rocr_names), and HIP_DEVICE_MEMORY_LIMIT_<i> follows that."""
    from rocshare.api.models import GpuInfo
    from rocshare_agent.monitor import memory_limit_bytes, visible_position

    def part(index: int) -> GpuInfo:
        return GpuInfo(id=f"GPU-e3aa140f9a5f9e31-p{index}", index=index, gfx_target_version=90402, cu_count=38,
                       pci_bdf=f"0000:05:00.{index}", split_count=1, healthy=True, vram_mib=24576)

    env = {"ROCR_VISIBLE_DEVICES": "1,0", "HIP_DEVICE_MEMORY_LIMIT_0": "100m", "HIP_DEVICE_MEMORY_LIMIT_1": "200m"}
    # The container holds partitions 6 and 5, in that order: 5 is rank 0 in KFD order, 6 rank 1.
    six, five = part(6), part(5)
    assert visible_position(env, six, [six, five]) == 0 and visible_position(env, five, [six, five]) == 1
    assert memory_limit_bytes(env, six, [six, five]) == 100 * 2**20
    assert memory_limit_bytes(env, five, [six, five]) == 200 * 2**20
