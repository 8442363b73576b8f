"""Discovery reads the counts the kernel deals a CU mask over (issue 41): the values are the
captures' own property lines, read here by hand from the files; the MI300X SPX capture is derived
from the CPX one (rocshare_dev.devcluster.captures.mi300x_spx, in tmp_path, labelled so)."""

from __future__ import annotations

import pytest

from rocshare.api.models import AmdGpuNodeStatus, CuLayout, Sharing
from rocshare.core.inventory import NodeInventory
from rocshare_agent.discovery import discover
from rocshare_dev.devcluster.captures import mi300x_spx

# (capture, GPUs, CUs, (numXCC, arrayCount, simdArraysPerEngine, cuPerSimdArray)) from the property files
CAPTURES = [
    ("mi210-8gpu-xgmi", 8, 104, (1, 8, 1, 14)),
    ("mi300x-8gpu-cpx", 63, 38, (1, 4, 1, 10)),
    ("rx7900xtx-kfd", 1, 96, (1, 12, 2, 8)),
    ("strixpoint-apu", 1, 12, (1, 2, 2, 8)),
    ("vega10-1gpu", 1, 64, (1, 4, 1, 16)),  # no num_xcc line: one XCC
]


@pytest.mark.parametrize(("capture", "gpus", "cus", "counts"), CAPTURES)
def test_every_capture_reports_its_topology(sysfs, capture, gpus, cus, counts) -> None:
    found = discover(sysfs / capture).gpus
    assert len(found) == gpus and {gpu.cu_count for gpu in found} == {cus}
    assert {(g.cu_topology.num_xcc, g.cu_topology.array_count, g.cu_topology.simd_arrays_per_engine,
             g.cu_topology.cu_per_simd_array) for g in found} == {counts}


def test_derived_mi300x_spx_is_eight_gpus_of_eight_xccs(sysfs, tmp_path) -> None:
    root = mi300x_spx(sysfs, tmp_path)
    assert "**Derived**" in (root / "DERIVED.txt").read_text()
    found = discover(root)
    assert found.problems == [] and len(found.gpus) == 8
    assert {(g.cu_count, g.partition, g.cu_topology.num_xcc, g.cu_topology.array_count) for g in found.gpus} == {
        (304, None, 8, 4)}
    specs = NodeInventory.from_gpu_infos("n", found.gpus, Sharing()).gpus
    assert {(s.cu_layout, s.topology.xcc_count, s.topology.se_per_xcc) for s in specs} == {(CuLayout.ISOLATED, 8, 4)}


def test_a_gpu_without_the_counts_has_no_topology_and_is_packed(copy_capture) -> None:
    root = copy_capture("mi210-8gpu-xgmi")
    for properties in root.glob("class/kfd/kfd/topology/nodes/*/properties"):
        lines = [line for line in properties.read_text().splitlines() if not line.startswith("array_count ")]
        properties.write_text("\n".join(lines) + "\n")
    found = discover(root).gpus
    assert {gpu.cu_topology for gpu in found} == {None}
    specs = NodeInventory.from_gpu_infos("n", found, Sharing()).gpus
    assert {spec.topology for spec in specs} == {None}  # choose_cus then hands out contiguous ranges


def test_a_status_from_an_older_agent_still_decodes() -> None:
    status = AmdGpuNodeStatus.model_validate({"gpus": [{
        "id": "GPU-1", "index": 0, "gfxTargetVersion": 90010, "cuCount": 104, "pciBDF": "0000:03:00.0",
        "splitCount": 10, "healthy": True}]})
    assert status.gpus[0].cu_topology is None
