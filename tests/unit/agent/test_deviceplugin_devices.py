"""devices: the kubelet device IDs (splitCount per GPU in cu mode, one per partition) and
the preferred-allocation ranking (committed GPUs, then XGMI, then NUMA). Pure."""

from __future__ import annotations

from pathlib import Path

from rocshare.api.models import GpuInfo, OperatingMode
from rocshare_agent.deviceplugin.devices import HEALTHY, UNHEALTHY, gpu_of, plugin_devices, slice_id
from rocshare_agent.deviceplugin.preferred import preferred_ids
from rocshare_agent.discovery import discover


def gpu(index: int, *, numa: int | None = 0, peers=(), split: int = 4, healthy: bool = True) -> GpuInfo:
    return GpuInfo(id=f"G{index}", index=index, render_minor=128 + index, gfx_target_version=90010, cu_count=104,
                   pci_bdf=f"0000:{index:02x}:00.0", numa=numa, xgmi_peers=[f"0000:{p:02x}:00.0" for p in peers],
                   split_count=split, healthy=healthy)


def test_cu_mode_offers_split_count_ids_per_gpu_with_numa():
    devices = plugin_devices([gpu(1, numa=1, split=2), gpu(0, numa=None, split=3)])
    assert [(d.id, d.numa) for d in devices] == [
        ("G0::0", None), ("G0::1", None), ("G0::2", None), ("G1::0", 1), ("G1::1", 1)]
    assert {gpu_of(d.id) for d in devices} == {"G0", "G1"}


def test_unhealthy_gpu_ids_stay_listed_as_unhealthy():
    devices = plugin_devices([gpu(0, split=2, healthy=False), gpu(1, split=2)])
    assert [d.health for d in devices] == [UNHEALTHY, UNHEALTHY, HEALTHY, HEALTHY]


def test_mi210_capture_gives_gpus_times_split_count(sysfs: Path):
    gpus = discover(sysfs / "mi210-8gpu-xgmi").gpus
    assert len(plugin_devices(gpus)) == 8 * 10


def test_partition_mode_on_mi300x_capture_gives_one_device_per_partition(sysfs: Path):
    gpus = discover(sysfs / "mi300x-8gpu-cpx", operating_mode=OperatingMode.PARTITION).gpus
    devices = plugin_devices(gpus)
    assert len(devices) == 63
    assert [d.id for d in devices] == [g.id for g in sorted(gpus, key=lambda g: g.index)]


# ---- preferred allocation ----------------------------------------------------------------

HIVE = {g.id: g for g in [gpu(0, numa=0, peers=(1,)), gpu(1, numa=0, peers=(0,)), gpu(2, numa=1), gpu(3, numa=0)]}
ALL_IDS = [slice_id(f"G{i}", k) for i in range(4) for k in range(4)]


def prefer(size: int, *, committed=(), must=(), available=ALL_IDS):
    return preferred_ids(available, list(must), size, committed_gpu_ids=list(committed), gpus=HIVE)


def test_committed_gpus_come_first_one_id_each():
    assert [gpu_of(i) for i in prefer(2, committed=["G2", "G3"])] == ["G2", "G3"]


def test_without_commitment_xgmi_peers_then_same_numa():
    assert [gpu_of(i) for i in prefer(2)] == ["G0", "G1"]
    assert [gpu_of(i) for i in prefer(3, must=["G3::0"])] == ["G3", "G0", "G1"]  # G0 shares NUMA 0 with G3


def test_must_include_is_kept_and_counted():
    chosen = prefer(2, must=["G2::3"])
    assert chosen[0] == "G2::3" and len(chosen) == 2 and gpu_of(chosen[1]) != "G2"


def test_more_ids_than_gpus_fills_the_chosen_gpus_again():
    chosen = prefer(3, available=["G0::0", "G0::1", "G2::0"])
    assert sorted(chosen) == ["G0::0", "G0::1", "G2::0"]


def test_never_more_than_asked_nor_unavailable_ids():
    chosen = prefer(2, committed=["G1"], available=["G1::2", "G3::0", "G3::1"])
    assert chosen == ["G1::2", "G3::0"]
