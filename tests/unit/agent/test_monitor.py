"""The monitor's collector on temp trees: KFD per-process VRAM mapped to pods through
/proc/<pid>/cgroup (a synthetic proc root), limits from the environment, host sensors."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from rocshare_agent.monitor import ContainerRef, GpuMetricsCollector, parse_cgroup, parse_limit_bytes

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


def _process(sysfs: Path, proc: Path, pid: int, vram: dict[int, int], cgroup: str, environ: dict[str, str]) -> None:
    kfd = sysfs / "class/kfd/kfd/proc" / str(pid)
    kfd.mkdir(parents=True)
    for gpu_id, used in vram.items():
        (kfd / f"vram_{gpu_id}").write_text(f"{used}\n")
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


def test_collector_on_a_temp_tree(copy_capture, tmp_path):
    sysfs = copy_capture("vega10-1gpu")
    proc = tmp_path / "proc"
    env = {"ROCR_VISIBLE_DEVICES": "GPU-c34ec50444dd0a6c", "HIP_DEVICE_MEMORY_LIMIT_0": "1024m"}
    _process(sysfs, proc, 100, {13261: 1000}, f"0::/kubepods/burstable/pod{UID}/{CID}\n", env)
    _process(sysfs, proc, 101, {13261: 500}, f"0::/kubepods/burstable/pod{UID}/{CID}\n", env)
    _process(sysfs, proc, 102, {13261: 7}, "0::/system.slice/sshd.service\n", {})  # not a pod: skipped
    _process(sysfs, proc, 103, {99999: 7}, f"0::/kubepods/pod{UID}/{'b' * 64}\n", {})  # unknown GPU: skipped
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=proc))
    labels = {"poduid": UID, "containerid": CID, "deviceuuid": "GPU-c34ec50444dd0a6c", "deviceidx": "0"}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", labels) == 1500
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 1024 * 2**20
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", {**labels, "containerid": "b" * 64}) is None


def test_whole_gpu_limit_is_its_vram(copy_capture, tmp_path):
    sysfs = copy_capture("vega10-1gpu")
    proc = tmp_path / "proc"
    _process(sysfs, proc, 100, {13261: 1}, f"0::/kubepods/pod{UID}/{CID}\n", {"ROCR_VISIBLE_DEVICES": "GPU-c34ec50444dd0a6c"})
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=proc))
    labels = {"poduid": UID, "containerid": CID, "deviceuuid": "GPU-c34ec50444dd0a6c", "deviceidx": "0"}
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 16368 * 2**20


def test_host_metrics_from_the_strix_capture(sysfs, tmp_path):
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs / "strixpoint-apu", proc_root=tmp_path))
    labels = {"deviceidx": "0", "deviceuuid": "GPU-pci-0000-c1-00-0", "devicetype": "Radeon 880M/890M", "pcibdf": "0000:c1:00.0"}
    assert registry.get_sample_value("hami_host_gpu_memory_used_bytes", labels) == 514580480
    assert registry.get_sample_value("hami_host_gpu_utilization_ratio", labels) == 0.03
    assert registry.get_sample_value("hami_host_gpu_temperature_celsius", labels) == 38.0
    assert registry.get_sample_value("hami_host_gpu_power_usage_watts", labels) == 9.087  # power1_input on APUs
