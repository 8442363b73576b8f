"""Discovery on synthetic variants of the captures (copies in tmp_path, never in the project):
what real nodes do that the captures do not show. Every variant here is synthetic."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rocshare.api.models import OperatingMode
from rocshare_agent.discovery import discover
from rocshare_agent.discovery.assemble import split_count_for
from rocshare_agent.discovery.kfd import parse_int, parse_properties

NODES = Path("class/kfd/kfd/topology/nodes")


def _set_property(properties: Path, key: str, value: str | None) -> None:
    lines = [line for line in properties.read_text().splitlines() if not line.startswith(key + " ")]
    if value is not None:
        lines.append(f"{key} {value}")
    properties.write_text("\n".join(lines) + "\n")


def test_nul_padding_and_trailing_newlines_change_nothing(copy_capture, sysfs):
    tree = copy_capture("strixpoint-apu")
    for path in tree.rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes() + b"\n\n\0\0\0\0")
    assert discover(tree).gpus == discover(sysfs / "strixpoint-apu").gpus


def test_missing_properties_is_a_problem_and_the_rest_publish(copy_capture):
    tree = copy_capture("mi210-8gpu-xgmi")
    (tree / NODES / "3" / "properties").unlink()
    result = discover(tree)
    assert len(result.gpus) == 7
    assert [(problem.path.split("/")[-1], problem.reason) for problem in result.problems] == [
        ("3", "properties file is missing or unreadable")
    ]


@pytest.mark.parametrize(("content", "reason"), [
    (b"\xff\xfe garbage \x00\x01", "properties file holds no `key value` lines"),
    (b"simd_count 416\nsimd_per_cu 0\nlocation_id 256\n", "simd_per_cu is 0: cannot derive the CU count"),
    (b"simd_count 417\nsimd_per_cu 4\nlocation_id 256\n", "simd_count 417 is not a multiple of simd_per_cu 4"),
    (b"simd_count 416\nsimd_per_cu 4\n", "location_id is missing"),
    (b"simd_count 416\nsimd_per_cu 4\nlocation_id 99999999\n", "location_id 99999999 is outside 0..65535"),
    (b"simd_count 416\nsimd_per_cu 4\nlocation_id 256\nunique_id 999999999999999999999\n",
     "unique_id 999999999999999999999 is outside 0..18446744073709551615"),
])
def test_broken_content_is_reported_never_raised(copy_capture, content, reason):
    tree = copy_capture("mi210-8gpu-xgmi")
    (tree / NODES / "9" / "properties").write_bytes(content)
    result = discover(tree)
    assert len(result.gpus) == 7
    assert [problem.reason for problem in result.problems] == [reason]


def test_garbage_links_and_mem_banks_are_ignored(copy_capture):
    tree = copy_capture("vega10-1gpu")
    (tree / NODES / "1" / "io_links" / "0" / "properties").write_text("nonsense\n")
    (tree / NODES / "1" / "mem_banks" / "0" / "properties").write_text("heap_type x\n")
    (gpu,) = discover(tree).gpus
    assert gpu.numa is None and gpu.vram_mib == 16368  # local_mem_size still there


def test_cpu_only_kfd_topology_has_no_gpus_and_no_problems(copy_capture):
    tree = copy_capture("mi210-8gpu-xgmi")
    for node in range(2, 10):
        shutil.rmtree(tree / NODES / str(node))
    assert discover(tree).gpus == [] and discover(tree).problems == []


def test_missing_sysfs_root_is_one_problem(tmp_path):
    result = discover(tmp_path / "nothing")
    assert result.gpus == [] and len(result.problems) == 1


def test_gpu_without_drm_folder_still_publishes(copy_capture):
    tree = copy_capture("strixpoint-apu")
    shutil.rmtree(tree / "class" / "drm")
    result = discover(tree)
    (gpu,) = result.gpus
    assert (gpu.card, gpu.cu_count, gpu.vram_mib) == (None, 12, 15679)
    assert gpu.numa == 0  # without DRM, the direct PCIe io_link to KFD CPU node 0
    assert (gpu.product, result.product_sources[gpu.id]) == ("AMD Radeon 880M Graphics", "rocshare-table")  # by CUs


def test_unique_id_zero_gets_a_pci_derived_id(copy_capture):
    tree = copy_capture("rx7900xtx-kfd")
    _set_property(tree / NODES / "1" / "properties", "unique_id", "0")
    assert discover(tree).gpus[0].id == "GPU-pci-0000-86-00-0"


def test_gfx12_auto_split_count_is_two_and_pool_override_wins(copy_capture):
    tree = copy_capture("rx7900xtx-kfd")
    _set_property(tree / NODES / "1" / "properties", "gfx_target_version", "120001")
    assert discover(tree).gpus[0].split_count == 2
    assert discover(tree, split_count=5).gpus[0].split_count == 5
    assert discover(tree, operating_mode=OperatingMode.PARTITION, split_count=5).gpus[0].split_count == 1


@pytest.mark.parametrize("folder", ["amdgpu_xcp_1", "amdgpu_xcp.1"])
def test_xcp_platform_folders_give_partitions_their_card(copy_capture, folder):
    tree = copy_capture("mi300x-8gpu-cpx")
    drm = tree / "devices" / "platform" / folder / "drm"
    (drm / "card9").mkdir(parents=True)
    (drm / "renderD129").mkdir()
    gpus = discover(tree).gpus
    assert gpus[1].render_minor == 129 and gpus[1].card == 9
    assert gpus[2].card is None


def _add_drm_card(tree: Path, card: int, bdf: str, files: dict[str, bytes]) -> Path:
    device = tree / "class" / "drm" / f"card{card}" / "device"
    device.mkdir(parents=True)
    (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_ID=1002:74A1\nPCI_SLOT_NAME={bdf}\n")
    for name, content in files.items():
        (device / name).write_bytes(content)
    return device


def test_drm_partition_modes_and_vram_share_for_partitions(copy_capture):
    tree = copy_capture("mi300x-8gpu-cpx")
    _add_drm_card(tree, 1, "0000:05:00.0", {
        "current_compute_partition": b"CPX\n\0\0", "current_memory_partition": b"NPS4\n",
        "mem_info_vram_total": b"206141652992\n", "numa_node": b"0\n", "product_name": b"AMD Instinct MI300X OAM\n",
    })
    gpus = discover(tree).gpus
    assert gpus[0].card == 1 and gpus[1].card is None  # partition 0 uses the PCI device's minors
    assert {(gpu.partition.memory_mode, gpu.vram_mib, gpu.product) for gpu in gpus[:8]} == {
        ("nps4", 206141652992 // 4 // 2**20, "AMD Instinct MI300X OAM")}
    assert gpus[8].vram_mib is None and gpus[8].partition.memory_mode is None


def test_extra_drm_connectors_and_non_amd_cards_are_ignored(copy_capture):
    tree = copy_capture("strixpoint-apu")
    (tree / "class" / "drm" / "card1-eDP-1").mkdir()
    other = tree / "class" / "drm" / "card0" / "device"
    other.mkdir(parents=True)
    (other / "uevent").write_text("DRIVER=ast\nPCI_ID=1A03:2000\nPCI_SLOT_NAME=0000:02:00.0\n")
    result = discover(tree)
    assert len(result.gpus) == 1 and result.problems == []


def test_parse_helpers():
    assert parse_properties("a 1\nb x\nc 0x10\n\nd 1 2\n") == {"a": 1, "c": 16}
    assert parse_int(" 42\n") == 42 and parse_int("nope") is None and parse_int(None) is None
    assert split_count_for(120000, operating_mode=OperatingMode.CU, pool_split_count=0) == 2
    assert split_count_for(129999, operating_mode=OperatingMode.CU, pool_split_count=0) == 2
    assert split_count_for(130000, operating_mode=OperatingMode.CU, pool_split_count=0) == 10
    assert split_count_for(110000, operating_mode=OperatingMode.CU, pool_split_count=0) == 10
