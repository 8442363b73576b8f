"""The placement benchmark: trace reading (files read in place from ../shared), the arrival
protocol, a small end-to-end simulation, and the CLI's argument handling."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rocshare_dev.bench import placement
from rocshare_dev.bench import simulation as sim
from rocshare_dev.bench.trace import TracePod, load_nodes, load_pods

TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "openb"
NODES = TRACES / "openb_node_list_gpu_node.csv"
needs_trace = pytest.mark.skipif(not NODES.exists(), reason="trace files not present at ../shared/traces/openb")


@needs_trace
def test_trace_files_load():
    nodes = load_nodes(NODES)
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    pods = load_pods(TRACES / "openb_pod_list_multigpu20.csv")  # five columns only
    assert all(p.gpu_spec == () for p in pods)
    spec = load_pods(TRACES / "openb_pod_list_gpuspec10.csv")
    assert any(len(p.gpu_spec) > 1 for p in spec)


def test_arrivals_stop_before_130_percent():
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 500) for i in range(10)]
    order = sim.arrivals(pods, seed=42, capacity_milli=4000)
    requested = sum(p.gpu_milli_total for p in order)
    assert requested <= 1.3 * 4000 < requested + 500
    assert sorted(p.name for p in order[:10]) == sorted(p.name for p in pods)  # the whole list first, shuffled


def test_pod_mapping_to_amd_terms():
    share = sim.pod_request(TracePod("a", 4000, 1024, 1, 470, ("T4",)), 0)
    container = share.containers[0]
    assert (container.memory_pct, container.cores_pct, container.gpus) == (47, 47, 1)
    assert share.selection.use_types == ("t4",) and share.cpu_milli == 4000
    whole = sim.pod_request(TracePod("b", 4000, 1024, 8, 1000), 1).containers[0]
    assert whole.whole and whole.gpus == 8
    assert sim.pod_request(TracePod("c", 4000, 1024, 0, 0), 2).containers == ()


@needs_trace
@pytest.mark.parametrize("policy", list(sim.POLICIES))
def test_small_simulation_runs_every_policy(policy):
    nodes = [sim.build_inventory(n) for n in load_nodes(NODES)[::40]]
    pods = load_pods(TRACES / "openb_pod_list_default.csv")[::40]
    model = sim.FragmentationModel(sim.typical_workload(pods))
    result = sim.run_seed(nodes, pods, sim.POLICIES[policy], 42, model)
    assert set(result.allocation_ratio) == {"100", "130"}
    assert 0 < result.allocation_ratio["100"] <= result.allocation_ratio["130"] <= 100
    assert result.placed > 0 and 0 <= result.fragmentation_ratio <= 100


def test_seeds_and_policy_names():
    assert placement.parse_seeds("42-44,50") == [42, 43, 44, 50]
    with pytest.raises(argparse.ArgumentTypeError):
        placement.parse_seeds("x")
    known = list(sim.POLICIES)
    assert placement.policy_names("all", known, sim.BEST) == known
    assert placement.policy_names("best", known, sim.BEST) == [sim.BEST]
    with pytest.raises(ValueError, match="unknown policy"):
        placement.policy_names("nope", known, sim.BEST)


def test_bench_dispatches_on_registry():
    from rocshare_dev.bench import cli

    assert cli.BENCHMARKS["placement"][0] == "rocshare_dev.bench.placement"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["placement", "--policy", "bestfit", "--seeds", "42"])
    assert args.seeds == [42] and args._bench_module == "rocshare_dev.bench.placement"
