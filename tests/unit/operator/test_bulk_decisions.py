"""Decisions that plan in bulk (rocshare.core.bulk) answer exactly as decisions that plan node by node.

The decision tests of test_extender_decisions.py that check answers (not how many plans were made)
run again here with the bulk planner answering every decision it can (BULK_MIN_NODES = 1): through
random churn, pools of different policies, stray nodes, rejections shared and rendered, commits,
releases, GPUs turning unhealthy, nodes losing GPUs or pools, quota. And on a fleet of 64 nodes with
the default threshold: filter's rejections and prioritize's scores, with the bulk planner on, equal
fresh plans of every node, while pods come and go and the refresher keeps the arrays in step.
"""

from __future__ import annotations

import random

import pytest

from rocshare.core.allocate import DEFAULT_CONTEXT, PodPlanner
from rocshare.core.fit import FitFailure
from rocshare.core.policies import normalize_scores
from rocshare_operator.extender import decisions
from rocshare_operator.extender.decisions import filter_nodes, node_rejection, policy_for, prioritize
from rocshare_operator.extender.refresh import Refresher
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.extender.workloads import reads_model

from tests.unit.operator.test_extender_decisions import (  # noqa: F401  (collected here again)
    add_node, commit, release, request, set_pool, state,
    test_a_commit_takes_the_room_at_once_and_a_release_gives_it_back,
    test_a_gpu_turning_unhealthy_drops_the_nodes_memo,
    test_a_node_losing_its_gpus_or_pool_answers_accordingly,
    test_a_pool_switching_policy_changes_the_scores,
    test_a_uuid_pinned_pod_is_not_answered_from_a_look_alike_node,
    test_memoised_filter_and_prioritize_match_a_fresh_plan_through_random_churn,
    test_nodes_failing_alike_share_one_rendered_rejection,
    test_nodes_of_pools_with_different_policies_are_answered_by_their_own,
    test_one_pool_answers_its_nodes_and_the_default_answers_strays,
    test_pool_membership_changing_between_decisions_is_seen_by_the_next,
    test_quota_is_read_fresh_on_every_call,
    test_rejection_text_names_reasons_per_gpu,
    test_two_pods_never_get_the_same_room,
)


@pytest.fixture(autouse=True)
def bulk_whenever_it_can(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.name.startswith("test_bulk_"):
        return  # this file's own tests keep the default threshold
    monkeypatch.setattr(decisions, "BULK_MIN_NODES", 1)


def scored_afresh(state: SchedulerState, pod, names: list[str]) -> dict[str, float]:
    """The scalar planner on every node, with the pool's policy and fragmentation model."""
    snap, scores = state.snapshot(), {}
    for name in names:
        node, policy = state.inventories[name], policy_for(snap, name, pod)
        ctx = snap.workloads.context("p") if reads_model(policy) else DEFAULT_CONTEXT
        plan = PodPlanner(pod, policy, ctx).plan(node, state.ledger.usage(node))
        if not isinstance(plan, FitFailure):
            scores[name] = plan.score
    return scores


@pytest.mark.parametrize("gpu_policy", ["fragmentation-aware", "binpack", "spread"])
async def test_bulk_decisions_on_a_fleet_equal_fresh_plans_while_pods_come_and_go(gpu_policy: str,
                                                                                   monkeypatch) -> None:
    planned = []
    real = decisions.BulkPlanner.plan
    monkeypatch.setattr(decisions.BulkPlanner, "plan", lambda self, *a, **k: planned.append(1) or real(self, *a, **k))
    rng = random.Random(gpu_policy)
    state = SchedulerState()
    set_pool(state, "p", gpuPolicy=gpu_policy)
    names = [f"n{i:02d}" for i in range(64)]
    for name in names:
        add_node(state, name, gpus=rng.choice((4, 8)), unhealthy=(1,) if rng.random() < 0.1 else ())
    refresher = Refresher(state)
    shapes = [dict(memory_mib=16384, cores_pct=25), dict(memory_mib=8192, cores_pct=10), dict(gpus=2),
              dict(gpus=1), dict(memory_mib=4096), dict(gpus=2, memory_mib=20480, cores_pct=30), dict(gpus=4)]
    live = []
    for serial in range(60):
        pod = request(f"p{serial}", **rng.choice(shapes))
        if rng.random() < 0.3:
            state.plans.clear()  # a never-seen shape: every node planned, in bulk
        result = filter_nodes(state.snapshot(), pod, names)
        for name in names:
            assert result.failed.get(name) == node_rejection(state.snapshot(), pod, name), (serial, name)
        scores = prioritize(state.snapshot(), pod, result.feasible).scores()
        expected = normalize_scores(scored_afresh(state, pod, result.feasible))
        assert scores == {name: expected.get(name, 0) for name in result.feasible}, serial
        if result.feasible:
            commit(state, pod, rng.choice(result.feasible))
            live.append(pod)
        if live and rng.random() < 0.5:
            await release(state, live.pop(rng.randrange(len(live))))
        if rng.random() < 0.5:
            await refresher.catch_up()
    assert len(planned) > 10  # the bulk planner answered many of those decisions
