"""The incremental per-shape ranking (lazy-deletion heap), the fixed per-seed node order, the
two tie rules, and the latency fields of the report -- table tests on tiny clusters."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from rocshare_dev.bench import simulation as sim
from rocshare_dev.bench.ranking import Ranking
from rocshare_dev.bench.trace import TraceNode, TracePod


@dataclass
class FakePlan:
    score: float


def ranking_over(scores: list[float | None]) -> tuple[Ranking, list[int]]:
    """A ranking whose node i scores ``scores[i]`` (None: does not fit), read live."""
    ranking = Ranking(len(scores), lambda i: None if scores[i] is None else FakePlan(scores[i]))
    versions = [0] * len(scores)
    ranking.refresh(versions, [])
    return ranking, versions


def bump(ranking: Ranking, versions: list[int], log: list[int], i: int) -> None:
    versions[i] += 1
    log.append(i)
    ranking.refresh(versions, log)


@pytest.mark.parametrize(
    ("scores", "top"),
    [([1.0, 3.0, 2.0], 1), ([2.0, 3.0, 3.0], 1), ([None, None], None), ([None, 0.5], 1)],
)
def test_top_is_the_best_score_then_the_smallest_index(scores, top):
    ranking, versions = ranking_over(scores)
    entry = ranking.top(versions)
    assert (entry[1] if entry else None) == top


def test_a_changed_node_is_replanned_whether_its_score_falls_or_rises():
    scores: list[float | None] = [1.0, 3.0, 2.0]
    ranking, versions = ranking_over(scores)
    log: list[int] = []
    scores[1] = 0.0  # falls: the stale 3.0 entry must not win
    bump(ranking, versions, log, 1)
    assert ranking.top(versions)[1] == 2
    scores[0] = 5.0  # rises
    bump(ranking, versions, log, 0)
    assert ranking.top(versions)[1] == 0
    scores[0] = None  # no longer fits
    bump(ranking, versions, log, 0)
    assert ranking.top(versions)[1] == 2


def test_only_logged_nodes_are_replanned():
    calls: list[int] = []
    ranking = Ranking(3, lambda i: calls.append(i) or FakePlan(1.0))
    versions, log = [0, 0, 0], []
    ranking.refresh(versions, log)
    assert sorted(calls) == [0, 1, 2]
    calls.clear()
    versions[2] += 1
    log += [2, 2]
    ranking.refresh(versions, log)
    ranking.refresh(versions, log)
    assert calls == [2]


def test_ties_at_top_lists_every_tie_and_keeps_them():
    ranking, versions = ranking_over([3.0, 1.0, 3.0, 3.0])
    assert sorted(ranking.ties_at_top(versions)) == [0, 2, 3]
    assert sorted(ranking.ties_at_top(versions)) == [0, 2, 3]
    assert ranking.top(versions)[1] == 0


def test_node_order_is_a_fixed_permutation_per_seed():
    nodes = [sim.build_inventory(TraceNode(f"n{i}", 8000, 8192, 1, "T4")) for i in range(20)]
    first, again = sim.node_order(nodes, 42), sim.node_order(nodes, 42)
    assert [n.name for n in first] == [n.name for n in again]
    assert sorted(n.name for n in first) == sorted(n.name for n in nodes)
    assert [n.name for n in sim.node_order(nodes, 43)] != [n.name for n in first]


def tiny_cluster() -> sim.Cluster:
    nodes = [sim.build_inventory(TraceNode(f"n{i}", 32_000, 65_536, 2, "T4")) for i in range(6)]
    pods = [TracePod("p", 1000, 1024, 1, 500)]
    model = sim.FragmentationModel(sim.typical_workload(pods))
    return sim.Cluster(nodes, sim.POLICIES["bestfit"], sim.scoring_context(nodes, model))


def test_ordered_ties_take_the_first_node_random_ties_spread():
    request = sim.pod_request(TracePod("p", 1000, 1024, 1, 500), 0)
    assert tiny_cluster().decide(request, None) == 0  # every empty node ties
    picks = {tiny_cluster().decide(request, random.Random(seed)) for seed in range(30)}
    assert len(picks) > 1


def test_decisions_follow_binds():
    cluster = tiny_cluster()
    for serial in range(4):  # BestFit packs: two halves per GPU, two GPUs per node
        request = sim.pod_request(TracePod("p", 1000, 1024, 1, 500), serial)
        assert cluster.decide(request, None) == 0
        cluster.bind(0, request)
    assert cluster.decide(sim.pod_request(TracePod("p", 1000, 1024, 1, 500), 9), None) == 1


def test_report_has_wall_and_cpu_latency():
    nodes = [sim.build_inventory(TraceNode(f"n{i}", 32_000, 65_536, 2, "T4")) for i in range(4)]
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 500) for i in range(8)]
    for ties in sim.TIES:
        report = sim.run_policy(nodes, pods, sim.BEST, [42], ties)
        assert set(report["latency_ms"]) == set(report["cpu_latency_ms"]) == {"p50", "p99", "max"}
        assert report["allocation_ratio"]["130"]["mean"] > 0


def test_cli_takes_the_tie_rule():
    import argparse

    from rocshare_dev.bench import placement

    parser = argparse.ArgumentParser()
    placement.add_arguments(parser)
    assert parser.parse_args([]).ties == sim.ORDERED
    assert parser.parse_args(["--ties", "random"]).ties == sim.RANDOM
    with pytest.raises(SystemExit):
        parser.parse_args(["--ties", "coin"])
