"""`rocshare-dev bench dra`'s pure parts: the DRA objects it creates (the product's codec on the
MI210 capture, the product's claim for bench e2e's slice) and its figures. Expected numbers are
worked out here from the capture (8 x MI210, 104 CUs; VRAM synthetic, 64 GiB) and the request."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rocshare.api.models import Sharing
from rocshare.core.resource_slices import resource_slice
from rocshare_agent.discovery import discover
from rocshare_dev.bench import all as bench_all
from rocshare_dev.bench import dra, e2e
from rocshare_dev.bench.burst import BurstResult
from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram

MI210_CUS, MI210_MIB = 104, 64 * 1024


@pytest.fixture(scope="module")
def gpus(tmp_path_factory):
    return discover(mi210_with_synthetic_vram(FIXTURES, Path(tmp_path_factory.mktemp("mi210")))).gpus


def test_the_template_asks_bench_e2es_slice_of_an_mi210(gpus):
    template = dra.claim_template("slice", "ns", e2e.SLICE, gpus)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    (shape,) = request["firstAvailable"]  # one GPU shape in the fleet
    assert shape["deviceClassName"] == f"{MI210_CUS}cu-{MI210_MIB}mi.gpu.rocshare.io" and shape["count"] == 1
    assert shape["capacity"]["requests"] == {"memory": f"{int(e2e.SLICE['amd.com/gpumem'])}Mi",
                                             "compute": str(math.ceil(MI210_CUS * 25 / 100))}
    assert "selectors" not in shape  # its class selects the shape


def test_the_template_fits_the_slice_the_codec_publishes(gpus):
    """The shape selector's numbers are the published device's: else no pod would ever bind."""
    devices = resource_slice(node_name="n", node_uid="u", gpus=gpus, sharing=Sharing(), generation=1)["spec"]["devices"]
    assert len(devices) == 8
    capacity = devices[0]["capacity"]
    assert capacity["compute"]["value"] == str(MI210_CUS)
    assert int(capacity["memory"]["value"]) == MI210_MIB * 2**20


def test_a_dra_pod_uses_its_claim_and_asks_no_device_plugin_resource():
    pod = dra.dra_pod("p00001", "bench-dra", "slice", {"schedulerName": "s"})
    spec = pod["spec"]
    assert spec["schedulerName"] == "s"
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "slice"}]
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}


def test_a_dra_node_offers_no_device_plugin_gpus_and_carries_the_phase_label():
    node = dra.dra_node("dra-00001")
    assert "amd.com/gpu" not in node["status"]["allocatable"]
    assert node["metadata"]["labels"]["rocshare.io/sim"] == "bench-dra"


def burst(pods: int, all_bound_s: float | None, bound: int | None = None) -> BurstResult:
    return BurstResult(pods=pods, running=0, failed={}, create_s=1.0, all_running_s=None, elapsed_s=all_bound_s or 60.0,
                       bound=pods if bound is None else bound, all_bound_s=all_bound_s)


def phase(result: BurstResult, cpu_s: float) -> dict:
    return {"burst": result, "cpu_s": {"kube-scheduler": cpu_s, "bench": 99.0}, "others_cpu_s": 0.0}


def test_figures_compare_bound_rates_and_cpu_per_bound_pod():
    figures = dra.figures(nodes=10, pods=100, dra_phase={**phase(burst(100, 4.0), 2.0), "allocated_claims": 100},
                          plain=phase(burst(100, 2.0), 1.0), extender=phase(burst(100, 5.0), 3.0))
    assert figures["dra_bound_pods_per_s"] == 25.0
    assert figures["dra_plain_bound_pods_per_s"] == 50.0
    assert figures["dra_extender_bound_pods_per_s"] == 20.0
    assert figures["dra_to_plain_bound_ratio"] == 0.5 and figures["dra_to_extender_bound_ratio"] == 1.25
    assert figures["dra_cpu_ms_per_bound_pod"] == 20.0  # 2 s over 100 pods, the bench's own watch left out


def test_figures_split_each_modes_cpu_per_bound_pod_by_process():
    dra_phase = {"burst": burst(100, 4.0), "cpu_s": {"kube-scheduler": 2.5, "kube-controller-manager": 0.7,
                                                      "bench": 99.0}, "others_cpu_s": 0.0}
    figures = dra.figures(nodes=10, pods=100, dra_phase=dra_phase, plain=phase(burst(100, 2.0), 1.0),
                          extender=phase(burst(50, 5.0), 3.0))
    assert figures["dra_cpu_ms_per_bound_pod_kube_scheduler"] == 25.0  # 2.5 s over 100 pods
    assert figures["dra_cpu_ms_per_bound_pod_kube_controller_manager"] == 7.0
    assert figures["dra_extender_cpu_ms_per_bound_pod_kube_scheduler"] == 60.0  # 3 s over 50 pods
    assert figures["dra_plain_cpu_ms_per_bound_pod_kube_scheduler"] == 10.0
    assert not any(key.endswith("_bench") for key in figures)  # the harness's own watch is no mode's cost


def test_an_unfinished_dra_burst_has_no_rate_and_says_how_far_it_got():
    figures = dra.figures(nodes=10, pods=100, dra_phase=phase(burst(100, None, bound=40), 2.0),
                          plain=phase(burst(100, 2.0), 1.0), extender=phase(burst(100, 5.0), 3.0))
    assert figures["dra_bound_pods_per_s"] == 0.0 and figures["dra_to_plain_bound_ratio"] is None
    assert figures["dra_bound_pods"] == 40


def test_bench_all_renders_the_dra_section_with_the_command_of_its_scale():
    section = {"figures": bench_all.dra_figures({"dra_nodes": 100, "dra_pods": 400, "dra_bound_pods_per_s": 12.5,
                                                 "dra_measure": "text", "dra_cpu_s_by_process": {}})}
    lines = bench_all._section_lines("dra", section)
    assert lines[0].startswith("## DRA mode")
    assert any("`dra_bound_pods_per_s` | 12.5" in line and "--nodes 100 --pods 400" in line for line in lines)


def test_write_inputs_gives_dra_allocbench_the_phases_slice_and_claim(tmp_path, gpus):
    dra.write_inputs(tmp_path)
    written = json.loads((tmp_path / "slice.json").read_text())
    assert written["spec"]["nodeName"] == "dra-00000" and len(written["spec"]["devices"]) == 8
    assert json.loads((tmp_path / "claim.json").read_text()) == dra.claim_template("t", "ns", e2e.SLICE,
                                                                                   gpus)["spec"]["spec"]
