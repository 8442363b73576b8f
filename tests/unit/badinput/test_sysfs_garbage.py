"""Discovery on sysfs trees with garbage files and missing folders (synthetic copies of the
captures in tmp_path): it never raises; an entry it cannot use becomes a DiscoveryProblem
naming the path and why, and the other GPUs are still published."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from rocshare_agent.discovery import discover

SYSFS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "sysfs").resolve()
NODES = Path("class/kfd/kfd/topology/nodes")


@pytest.fixture
def capture(tmp_path: Path):
    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(SYSFS / name, target, symlinks=True)
        for path in [target, *target.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        return target
    return copy


def gpu_node_dirs(tree: Path) -> list[Path]:
    def simd_count(path: Path) -> int:
        lines = [line.split() for line in (path / "properties").read_text().splitlines()]
        return next((int(parts[1]) for parts in lines if parts[:1] == ["simd_count"]), 0)
    return sorted(path for path in (tree / NODES).iterdir() if simd_count(path) > 0)


def reasons(result) -> list[str]:
    return [problem.reason for problem in result.problems]


@pytest.mark.parametrize("seed", range(8))
def test_binary_garbage_in_a_properties_file(capture, seed: int) -> None:
    tree = capture("mi210-8gpu-xgmi")
    garbage = random.Random(seed).randbytes(512).replace(b"\n", b"x")
    (gpu_node_dirs(tree)[0] / "properties").write_bytes(garbage)
    result = discover(tree)
    assert len(result.gpus) == 7 and any("properties" in reason for reason in reasons(result)), reasons(result)


def test_garbage_that_parses_as_one_key_value_pair(capture) -> None:
    """Random bytes sometimes split (on \\r, \\v, \\x1c...) into a line like `9q 7`: before, the
    node then had values but no simd_count and vanished as "neither GPU nor CPU", with no problem."""
    tree = capture("mi210-8gpu-xgmi")
    (gpu_node_dirs(tree)[0] / "properties").write_bytes(b"\x8f\xa2\r9q 7\r\xff\xfe")
    result = discover(tree)
    assert len(result.gpus) == 7 and "properties file has no simd_count line" in " ".join(reasons(result))


def test_numbers_replaced_by_words(capture) -> None:
    tree = capture("mi210-8gpu-xgmi")
    first = gpu_node_dirs(tree)[0] / "properties"
    first.write_text(first.read_text().replace("simd_count ", "simd_count many_"))
    result = discover(tree)
    assert len(result.gpus) == 7 and any("simd_count is not a number" in reason for reason in reasons(result))


def test_simd_count_not_a_multiple_of_simd_per_cu(capture) -> None:
    tree = capture("vega10-1gpu")
    properties = gpu_node_dirs(tree)[0] / "properties"
    lines = [line if not line.startswith("simd_count ") else "simd_count 257"
             for line in properties.read_text().splitlines()]
    properties.write_text("\n".join(lines) + "\n")
    assert "not a multiple of simd_per_cu" in " ".join(reasons(discover(tree)))


def test_missing_topology_folder(capture) -> None:
    tree = capture("strixpoint-apu")
    shutil.rmtree(tree / "class" / "kfd")
    result = discover(tree)
    assert result.gpus == [] and "no KFD topology" in reasons(result)[0]


def test_missing_drm_folder_keeps_kfd_gpus(capture) -> None:
    tree = capture("vega10-1gpu")
    shutil.rmtree(tree / "class" / "drm", ignore_errors=True)
    assert len(discover(tree).gpus) == 1


def test_empty_sysfs_root(tmp_path: Path) -> None:
    result = discover(tmp_path)
    assert result.gpus == [] and result.problems


def test_a_sysfs_root_that_does_not_exist(tmp_path: Path) -> None:
    result = discover(tmp_path / "nowhere")
    assert result.gpus == [] and "no KFD topology" in reasons(result)[0]


def test_garbage_link_and_memory_bank_files(capture) -> None:
    tree = capture("mi210-8gpu-xgmi")
    node = gpu_node_dirs(tree)[0]
    for path in [*node.glob("io_links/*/properties"), *node.glob("mem_banks/*/properties")]:
        path.write_text("type\x00\x00 eleven\nnode_to -1x\n")
    result = discover(tree)
    assert len(result.gpus) == 8  # garbage links are skipped; the GPU itself is fine


def test_a_node_folder_that_is_a_file(capture) -> None:
    tree = capture("vega10-1gpu")
    (tree / NODES / "99").write_text("not a folder")
    assert len(discover(tree).gpus) == 1


def test_drm_files_with_garbage(capture) -> None:
    tree = capture("vega10-1gpu")
    for name in ("mem_info_vram_total", "unique_id", "numa_node", "product_name"):
        for path in tree.glob(f"class/drm/card*/device/{name}"):
            target = path.resolve()
            if target.is_file():
                target.write_bytes(b"\xff\xfe garbage \x00")
    result = discover(tree)
    assert len(result.gpus) == 1
