"""`rocshare-dev bench replay --mode dra`'s pure parts: each trace pod becomes the pod and claim the
admission webhook writes in a DRA pool, the nodes carry the trace's CPU and memory and the
product's ResourceSlice of the resized capture, and the ratios come from the pods' decisions.
Expected numbers are worked out here from the trace values (100 CUs per GPU, the model's VRAM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocshare.api.models import Sharing
from rocshare.core.resource_slices import resource_slice
from rocshare_dev.bench import all as bench_all
from rocshare_dev.bench.replay_common import Outcome, node_names
from rocshare_dev.bench.replay_dra import dra_pod_object, dra_pods, pool_shapes, template_classes, trace_gpus, \
    trace_node_object
from rocshare_dev.bench.trace import TraceNode, TracePod

T4_MIB, G2_MIB = 15100, 16300  # simulation.MODEL_VRAM_MIB
SUBSET = [TraceNode("openb-node-1", 104000, 524288, 2, "T4"), TraceNode("openb-node-2", 96000, 393216, 8, "G2"),
          TraceNode("openb-node-3", 96000, 393216, 8, "G2")]


@pytest.fixture(scope="module")
def gpus(tmp_path_factory) -> dict:
    return trace_gpus(Path(tmp_path_factory.mktemp("captures")), node_names(SUBSET))


@pytest.fixture(scope="module")
def shapes(gpus):
    return pool_shapes(gpus.values())


def test_the_pool_has_one_shape_per_model_vram(shapes):
    assert [(spec.cu_count, spec.memory_mib) for spec in shapes] == [(100, T4_MIB), (100, G2_MIB)]


def test_a_share_becomes_a_claim_per_shape_with_its_exact_share(shapes):
    body, (template,) = dra_pod_object(TracePod("openb-pod-1", 12000, 4096, 1, 470), 7, shapes)
    resources = body["spec"]["containers"][0]["resources"]
    assert body["metadata"]["name"] == "p00007" and body["spec"]["schedulerName"] == "baseline-scheduler"
    assert resources["requests"] == {"cpu": "12000m", "memory": "4096Mi"} and "limits" not in resources
    (claim,) = body["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert resources["claims"] == [{"name": claim["name"]}]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    asked = [(sub["count"], sub["capacity"]["requests"]) for sub in request["firstAvailable"]]
    # 47 % of 100 CUs, and 47 % of each model's VRAM rounded down to whole MiB
    assert asked == [(1, {"memory": f"{T4_MIB * 47 // 100}Mi", "compute": "47"}),
                     (1, {"memory": f"{G2_MIB * 47 // 100}Mi", "compute": "47"})]


def test_whole_gpus_ask_distinct_devices_at_their_default_capacity(shapes):
    _, (template,) = dra_pod_object(TracePod("openb-pod-2", 8000, 1024, 8, 1000), 8, shapes)
    spec = template["spec"]["spec"]["devices"]
    (request,) = spec["requests"]
    assert request["exactly"]["count"] == 8 and "capacity" not in request["exactly"]
    assert spec["constraints"][0]["distinctAttribute"].endswith("/uuid")


def test_a_cpu_only_pod_has_no_claim_and_the_same_scheduler(shapes):
    body, templates = dra_pod_object(TracePod("openb-pod-3", 8000, 1024, 0, 0), 9, shapes)
    assert templates == () and "resourceClaims" not in body["spec"]
    assert body["spec"]["schedulerName"] == "baseline-scheduler"


def test_equal_requests_share_one_template(shapes):
    sequence = [TracePod("a", 1000, 1024, 1, 250), TracePod("b", 2000, 2048, 1, 250), TracePod("c", 1000, 1024, 1, 500),
                TracePod("d", 1000, 1024, 0, 0)]
    bodies, templates = dra_pods(sequence, shapes)
    used = [body["spec"].get("resourceClaims", [{}])[0].get("resourceClaimTemplateName") for body in bodies]
    assert used[0] == used[1] != used[2] and used[3] is None
    assert sorted(template["metadata"]["name"] for template in templates) == sorted({used[0], used[2]})


def test_the_claim_fits_the_slice_the_codec_publishes_for_the_node(gpus, shapes):
    """The shape selector's numbers are the published device's: else no share would ever bind."""
    t4 = next(name for name, node in node_names(SUBSET).items() if node.model == "T4")
    published = resource_slice(node_name=t4, node_uid="u", gpus=gpus[t4], sharing=Sharing(), generation=1)
    devices = published["spec"]["devices"]
    assert len(devices) == 2
    assert devices[0]["capacity"]["compute"]["value"] == "100"
    assert int(devices[0]["capacity"]["memory"]["value"]) == T4_MIB * 2**20
    _, (template,) = dra_pod_object(TracePod("p", 1000, 1024, 1, 300), 1, shapes)
    # The first subrequest names the class of the T4's shape; the class selects it.
    named = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["deviceClassName"]
    device_class = next(body for body in template_classes([template], shapes) if body["metadata"]["name"] == named)
    selector = device_class["spec"]["selectors"][0]["cel"]
    assert "quantity('100')" in selector["expression"] and f"quantity('{T4_MIB}Mi')" in selector["expression"]


def test_a_node_has_the_trace_cpu_and_memory_and_no_device_plugin_gpus():
    node = trace_node_object("rp00-0000", SUBSET[0])
    for resources in (node["status"]["capacity"], node["status"]["allocatable"]):
        assert resources["cpu"] == "104000m" and resources["memory"] == "524288Mi" and resources["pods"] == "1000"
        assert "amd.com/gpu" not in resources
    assert node["metadata"]["labels"]["rocshare.io/sim"] == "replay"


def test_ratios_are_read_from_the_decisions_where_arrivals_pass_100_and_130_percent():
    outcome = Outcome(capacity_milli=4000)
    decisions = [(TracePod("a", 1, 1, 1, 1000), "n1"), (TracePod("b", 1, 1, 2, 1000), None),
                 (TracePod("c", 1, 1, 1, 1000), "n2"), (TracePod("d", 1, 1, 1, 500), "n1"),
                 (TracePod("e", 1, 1, 1, 500), "n2")]
    for pod, node in decisions:
        outcome.add(pod, node)
    # arrivals 25, 75, 100 (read: 2000 of 4000 bound), 112.5, 125 %: the sequence ends below 130 %,
    # so that point is read at the end (3000 of 4000)
    assert outcome.summary()["allocation_ratio"] == {"100": 50.0, "130": 75.0}
    assert (outcome.placed, outcome.failed) == (4, 1)


def replay_report() -> dict:
    def mode(at_100: float, at_130: float, placed: int) -> dict:
        return {"allocation_ratio": {"100": at_100, "130": at_130}, "final_allocation_ratio": at_130,
                "placed": placed, "wall_s": 90.0, "allocated_claims": 400, "bound_gpu_pods": 400}

    return {"scale": 0.25, "seed": 42, "nodes": 304, "gpus": 1566, "pods_arrived": 2717,
            "extender": mode(90.5, 95.47, 2400), "dra": mode(88.0, 91.2, 2350)}


def test_the_replay_figures_give_both_ratios_and_what_first_fit_costs():
    figures = bench_all.dra_replay_figures(replay_report())
    assert figures["dra_replay_alloc_pct_at_130_extender"] == 95.47
    assert figures["dra_replay_alloc_pct_at_130_dra"] == 91.2
    assert figures["dra_replay_placement_lost_pct_at_130"] == pytest.approx(95.47 - 91.2)
    assert figures["dra_replay_allocated_claims_dra"] == figures["dra_replay_bound_gpu_pods_dra"] == 400


def test_bench_all_renders_the_replay_figures_each_with_its_mode_command():
    section = {"figures": {"dra_nodes": 500, "dra_pods": 2000, **bench_all.dra_replay_figures(replay_report())},
               "note": "note"}
    lines = bench_all._section_lines("dra", section)
    assert lines[0].startswith("## DRA mode") and "replay" in lines[0]
    row = next(line for line in lines if "`dra_replay_alloc_pct_at_130_dra`" in line)
    assert "| 91.2 |" in row and "bench replay --mode dra --scale 0.25 --seed 42" in row
    row = next(line for line in lines if "`dra_replay_alloc_pct_at_130_extender`" in line)
    assert "bench replay --mode extender --scale 0.25" in row
    assert any(line == "note" for line in lines)


def test_a_gpu_pod_carries_the_request_the_webhook_keeps_and_the_pool_serves_dra(shapes):
    """Issue 42: the extender scores a replay pod from the same annotation the webhook writes."""
    from rocshare.api.dra_request import request_of, with_limits
    from rocshare.core.holdings import placement_request
    from rocshare_dev.bench.replay_common import pod_object
    from rocshare_dev.bench.replay_dra import dra_pool

    pod = TracePod("openb-pod-7", 4000, 2048, 1, 500)
    body, _ = dra_pod_object(pod, 7, shapes)
    assert placement_request(with_limits(body, request_of(body))) == placement_request(pod_object(pod, 7))
    assert dra_pool({"gpuPolicy": "fragmentation-aware"})["spec"]["agent"] == {"interface": "DRA"}
