"""bench replay's pure parts: the node sample keeps each GPU model's share, the pod sequence is
the simulator's arrival order cut at 130 % of the sample's capacity, and a trace pod becomes the
pod a user would write (gpu_milli m < 1000 -> gpucores and gpumem-percentage m/10)."""

from __future__ import annotations

from collections import Counter

from rocshare_dev.bench.replay import sample_nodes, sequence_for
from rocshare_dev.bench.replay_common import pod_object
from rocshare_dev.bench.trace import TraceNode, TracePod


def nodes() -> list[TraceNode]:
    return ([TraceNode(f"g2-{i}", 96000, 393216, 8, "G2") for i in range(40)]
            + [TraceNode(f"t4-{i}", 104000, 524288, 2, "T4") for i in range(20)]
            + [TraceNode(f"a10-{i}", 128000, 1048576, 1, "A10") for i in range(4)])


def test_sample_keeps_the_model_mix_and_the_list_order() -> None:
    sample = sample_nodes(nodes(), 0.25, seed=42)
    assert Counter(node.model for node in sample) == {"G2": 10, "T4": 5, "A10": 1}
    positions = [nodes().index(node) for node in sample]
    assert positions == sorted(positions)
    assert sample == sample_nodes(nodes(), 0.25, seed=42)


def test_sequence_stops_before_130_percent_of_the_sample() -> None:
    sample = sample_nodes(nodes(), 0.25, seed=1)
    capacity = sum(node.gpus for node in sample) * 1000
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 500) for i in range(1000)]
    sequence = sequence_for(sample, pods, seed=1)
    asked = sum(pod.gpu_milli_total for pod in sequence)
    assert asked <= 1.3 * capacity < asked + 500


def test_pod_object_maps_shares_and_whole_gpus() -> None:
    share = pod_object(TracePod("openb-pod-1", 12000, 4096, 1, 470), 7)
    container = share["spec"]["containers"][0]["resources"]
    assert share["metadata"]["name"] == "p00007"
    assert share["spec"]["schedulerName"] == "rocshare-scheduler"
    assert container["requests"] == {"cpu": "12000m", "memory": "4096Mi"}
    assert container["limits"] == {"amd.com/gpu": "1", "amd.com/gpucores": "47", "amd.com/gpumem-percentage": "47"}
    whole = pod_object(TracePod("openb-pod-2", 8000, 1024, 8, 1000), 8)
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "8"}
    cpu_only = pod_object(TracePod("openb-pod-3", 8000, 1024, 0, 0), 9)
    assert "limits" not in cpu_only["spec"]["containers"][0]["resources"]


def test_the_mode_picks_the_real_run_and_its_description(monkeypatch, tmp_path) -> None:
    from rocshare_dev.bench import replay, replay_cluster, replay_dra

    calls: list[str] = []

    async def extender(root, subset, sequence, scheduling, timeout_s):
        calls.append(f"extender {scheduling['gpuPolicy']}")
        return {"allocation_ratio": {"100": 1.0, "130": 2.0}}

    async def dra(root, subset, sequence, timeout_s, scheduling):
        calls.append(f"dra {scheduling['gpuPolicy'] if scheduling else 'unscored'}")
        return {"allocation_ratio": {"100": 3.0, "130": 4.0}}

    monkeypatch.setattr(replay_cluster, "run_extender", extender)
    monkeypatch.setattr(replay_dra, "run_dra", dra)
    results = {mode: replay.run_real([], [], policy="binpack", scheduling={"gpuPolicy": "binpack"},
                                     decision_timeout_s=1, work_dir=tmp_path / mode, keep=True, mode=mode)
               for mode in replay.CLI_MODES}
    assert calls == ["extender binpack", "dra binpack", "dra unscored"]  # DRA mode's nodes scored by the policy
    assert results["extender"]["what"] == replay_cluster.WHAT and results["dra"]["what"] == replay_dra.WHAT
    assert results["dra-unscored"]["what"] == replay_dra.WHAT_UNSCORED
    assert {mode: result["mode"] for mode, result in results.items()} == {mode: mode for mode in replay.CLI_MODES}
