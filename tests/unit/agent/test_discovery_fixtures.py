"""Discovery on every real capture in ../shared/fixtures/sysfs, asserting exact values."""

from __future__ import annotations

from collections import Counter, defaultdict

from rocshare.api.models import OperatingMode
from rocshare_agent.discovery import discover


def test_mi210_eight_gpus_in_two_xgmi_hives_of_four(sysfs):
    result = discover(sysfs / "mi210-8gpu-xgmi")
    assert result.problems == []
    assert len(result.gpus) == 8
    assert {gpu.cu_count for gpu in result.gpus} == {104}
    assert {gpu.gfx_target_version for gpu in result.gpus} == {90010}
    assert {gpu.product for gpu in result.gpus} == {"AMD Instinct MI210"}
    assert [gpu.pci_bdf for gpu in result.gpus] == [
        "0000:63:00.0", "0000:43:00.0", "0000:03:00.0", "0000:26:00.0",
        "0000:e3:00.0", "0000:c3:00.0", "0000:83:00.0", "0000:a3:00.0",
    ]
    assert [gpu.render_minor for gpu in result.gpus] == list(range(128, 136))
    assert result.gpus[0].id == "GPU-1901ead3a2ecd4a6"  # unique_id 1801979520617338022
    hives = defaultdict(set)
    for gpu in result.gpus:
        hives[gpu.hive_id].add(gpu.pci_bdf)
    assert {hive: len(members) for hive, members in hives.items()} == {"0xaefdf8293fefa6b7": 4, "0xfb11632c00f4d272": 4}
    for gpu in result.gpus:  # XGMI peers are exactly the other members of the hive
        assert set(gpu.xgmi_peers) == hives[gpu.hive_id] - {gpu.pci_bdf}
    assert [gpu.numa for gpu in result.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {gpu.vram_mib for gpu in result.gpus} == {None}  # no mem_banks, no DRM: unknown
    assert {(gpu.split_count, gpu.cu_per_wgp, gpu.partition) for gpu in result.gpus} == {(10, 1, None)}


def test_mi300x_cpx_63_partitions_under_8_gpus(sysfs):
    result = discover(sysfs / "mi300x-8gpu-cpx")
    assert len(result.gpus) == 63
    assert {gpu.cu_count for gpu in result.gpus} == {38}
    assert {gpu.gfx_target_version for gpu in result.gpus} == {90402}
    parents = Counter(gpu.partition.parent_bdf for gpu in result.gpus)
    assert len(parents) == 8
    assert sorted(parents.values()) == [7, 8, 8, 8, 8, 8, 8, 8]
    assert parents["0000:e5:00.0"] == 7
    assert {gpu.partition.compute_mode for gpu in result.gpus} == {"cpx"}
    first = result.gpus[:8]
    assert [gpu.partition.index for gpu in first] == list(range(8))
    assert [gpu.pci_bdf for gpu in first] == [f"0000:05:00.{function}" for function in range(8)]
    assert [gpu.id for gpu in first] == [f"GPU-e3aa140f9a5f9e31-p{index}" for index in range(8)]
    assert len({gpu.id for gpu in result.gpus}) == 63
    assert len(result.gpus[0].xgmi_peers) == 62  # every other partition, on this GPU and the others
    assert [problem.reason for problem in result.problems] == [
        "GPU 0000:e5:00.0 shows 7 of 8 partitions: the kernel ran out of DRM minors (it has 64); "
        "the missing ones cannot be used"
    ]


def test_mi300x_partition_mode_makes_every_partition_unshared(sysfs):
    result = discover(sysfs / "mi300x-8gpu-cpx", operating_mode=OperatingMode.PARTITION, split_count=4)
    assert {gpu.split_count for gpu in result.gpus} == {1}


def test_rx7900xtx_96_cus_in_pairs(sysfs):
    (gpu,) = discover(sysfs / "rx7900xtx-kfd").gpus
    assert (gpu.cu_count, gpu.cu_per_wgp, gpu.gfx_target_version) == (96, 2, 110000)
    assert (gpu.device_id, gpu.pci_bdf, gpu.render_minor, gpu.numa) == ("0x744c", "0000:86:00.0", 128, None)
    assert gpu.id == "GPU-a1ffc9d1799c317f"


def test_rx7900xtx_drm_only_capture_has_no_compute_gpu(sysfs):
    result = discover(sysfs / "rx7900xtx-drm")
    assert result.gpus == []
    assert [problem.reason for problem in result.problems] == [
        "no KFD topology: amdgpu not loaded, or no GPU ROCm can use",
        "amdgpu card0 (0000:03:00.0, AMD Radeon RX 7900 GRE / AMD Radeon RX 7900 XT / AMD Radeon RX 7900 XTX / "
        "AMD Radeon RX 7900M) has no KFD node: not usable for compute",  # no revision file: every 0x744c name
    ]


def test_strix_point_apu(sysfs):
    result = discover(sysfs / "strixpoint-apu")
    assert result.problems == []
    (gpu,) = result.gpus
    assert (gpu.cu_count, gpu.cu_per_wgp, gpu.gfx_target_version) == (12, 2, 110500)
    assert gpu.numa is None  # numa_node -1: unknown, not an error
    assert gpu.id == "GPU-pci-0000-c1-00-0"  # unique_id 0 on APUs
    assert (gpu.card, gpu.pci_bdf) == (1, "0000:c1:00.0")
    assert gpu.vram_mib == 15679  # KFD's heap (what ROCm hands out), not DRM's 512 MiB carve-out


def test_vega10_64_cus_16_gib_and_the_duplicated_node_skipped(sysfs):
    result = discover(sysfs / "vega10-1gpu")
    (gpu,) = result.gpus
    assert (gpu.cu_count, gpu.vram_mib, gpu.gfx_target_version) == (64, 16368, 90000)  # 16 GiB less firmware
    assert gpu.pci_bdf == "0000:19:00.0"
    assert len(result.problems) == 1
    assert result.problems[0].path.endswith("topology/nodes/2")
    assert "same PCI address 0000:19:00.0 as KFD node 1" in result.problems[0].reason


def test_json_output_keeps_unknowns_as_null(sysfs):
    payload = discover(sysfs / "mi210-8gpu-xgmi").to_json_dict()
    assert payload["gpus"][0]["vramMiB"] is None and payload["gpus"][0]["numa"] == 0
    assert payload["problems"] == []
