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


def running_burst(pods: int, all_bound_s: float, all_running_s: float | None,
                  running: int | None = None) -> BurstResult:
    ran = pods if running is None else running
    return BurstResult(pods=pods, running=ran, failed={}, create_s=1.0, all_running_s=all_running_s,
                       elapsed_s=all_running_s or 60.0, bound=pods, all_bound_s=all_bound_s)


def test_figures_compare_create_to_running_rates_of_the_three_modes():
    figures = dra.figures(nodes=10, pods=100, dra_phase=phase(running_burst(100, 4.0, 5.0), 2.0),
                          plain=phase(running_burst(100, 2.0, 2.5), 1.0),
                          extender=phase(running_burst(100, 3.0, 4.0), 3.0))
    assert figures["dra_running_pods_per_s"] == 20.0  # 100 pods over 5 s, first create to last Running
    assert figures["dra_plain_running_pods_per_s"] == 40.0 and figures["dra_extender_running_pods_per_s"] == 25.0
    assert figures["dra_to_extender_running_ratio"] == 0.8 and figures["dra_to_plain_running_ratio"] == 0.5
    assert figures["dra_bound_pods_per_s"] == 25.0  # bound stays reported beside it
    assert figures["dra_running_pods"] == 100 and figures["dra_failed_pods"] == 0


def test_a_dra_burst_not_all_running_has_no_running_rate():
    figures = dra.figures(nodes=10, pods=100, dra_phase=phase(running_burst(100, 4.0, None, running=60), 2.0),
                          plain=phase(running_burst(100, 2.0, 2.5), 1.0),
                          extender=phase(running_burst(100, 3.0, 4.0), 3.0))
    assert figures["dra_running_pods_per_s"] == 0.0 and figures["dra_to_extender_running_ratio"] is None
    assert figures["dra_running_pods"] == 60


def test_bound_only_figures_claim_no_running_rate_for_dra():
    figures = dra.figures(nodes=10, pods=100, dra_phase=phase(burst(100, 4.0), 2.0), plain=phase(burst(100, 2.0), 1.0),
                          extender=phase(burst(100, 5.0), 3.0), bound_only=True)
    assert "dra_running_pods_per_s" not in figures and figures["dra_measure"] == dra.MEASURE_BOUND_ONLY


def test_the_default_shape_is_small_and_the_upstream_shape_is_scheduler_perfs():
    assert dra.shape(None, None, upstream=False) == (dra.DEFAULT_NODES, dra.DEFAULT_PODS)
    assert dra.shape(None, None, upstream=True) == (500, 2000)
    assert dra.shape(None, 50, upstream=True) == (500, 50)  # explicit sizes still win


def test_the_dra_section_opens_with_one_row_per_mode():
    figures = {"dra_nodes": 10, "dra_pods": 100, "dra_running_pods_per_s": 20.0, "dra_bound_pods_per_s": 25.0,
               "dra_extender_running_pods_per_s": 25.0, "dra_plain_running_pods_per_s": 40.0,
               "dra_cpu_ms_per_bound_pod": 30.0, "dra_cpu_ms_per_bound_pod_kube_scheduler": 12.5,
               "dra_extender_cpu_ms_per_bound_pod_operator": 4.0, "dra_to_extender_running_ratio": 0.8}
    lines = bench_all.dra_summary_lines(figures)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[2:5]}
    assert rows["DRA"][1:5] == ["20", "25", "30", "12.5"]
    assert rows["extender"][1] == "25" and rows["extender"][-1] == "4 |"  # the operator is the last column
    assert "0.8×" in lines[6]


def test_only_runs_the_named_sections_and_keeps_the_others_from_the_previous_report(tmp_path, monkeypatch):
    previous = {"figures": {}, "sections": {"e2e": {"figures": {"e2e_pods_per_s": 1.5}},
                                            "hook": {"figures": {"hook_added_p99_ns_stub": 7.0}}}}
    (tmp_path / "benchmarks.json").write_text(json.dumps(previous))
    ran = []
    monkeypatch.setattr(bench_all, "RUNNERS", {name: (lambda args, name=name: ran.append(name) or {
        "figures": {f"{name}_fresh": 1.0}}) for name in bench_all.SECTIONS})
    monkeypatch.setattr(bench_all, "_e2e_saved", lambda: {"e2e_pods_per_s": 99.0})  # a stale local run
    monkeypatch.setattr(bench_all, "draw_chart", lambda report, path: None)
    args = bench_all.argparse.Namespace(out=str(tmp_path), skip="", only="dra", render_only=False)
    assert bench_all.run(args) == 0
    assert ran == ["dra"]
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert report["figures"]["dra_fresh"] == 1.0
    assert report["sections"]["e2e"]["figures"]["e2e_pods_per_s"] == 1.5  # the report's, not the local file's
    assert report["sections"]["hook"]["carried_over"] is True
