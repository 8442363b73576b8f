"""conditions, usage, pool_status and share_logic: status sums, cores percent rounding,
transition times, quota bodies and bounded pod lists."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import ShareLimits, ShareUsage
from rocshare_operator.status.conditions import ConditionState, merge_conditions
from rocshare_operator.status.pool_status import Inventory, PoolFacts, pool_status
from rocshare_operator.status.share_logic import (PODS_LISTED_MAX, quota_body, quota_hard, quota_name, quota_used,
                                                       quota_used_differs, share_status)
from rocshare_operator.status.usage import GpuSummary, pod_slices

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def device(gpu_id: str, memory_mib: int, cu_count: int, **flags) -> dict:
    """A CU slice pinned to CUs 0..cu_count-1 (unless `whole` or other flags say otherwise)."""
    ranges = [] if flags.get("whole") or flags.get("reservesAllCores") else [[0, cu_count - 1]]
    return {"gpuId": gpu_id, "memoryMiB": memory_mib, "cuCount": cu_count, "cuRanges": ranges, **flags}


def pod(name: str, node: str, *containers: dict, phase: str = "Pending", namespace: str = "ns",
        annotation: str | None = None) -> dict:
    text = annotation if annotation is not None else encode_record(AllocationRecord.model_validate(
        {"version": 1, "node": node, "containers": list(containers)}))
    return {"metadata": {"name": name, "namespace": namespace, "annotations": {ALLOCATION_ANNOTATION: text}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def container(name: str, *devices: dict, init: bool = False) -> dict:
    return {"name": name, "init": init, "devices": list(devices)}


# ---- conditions ---------------------------------------------------------------------------------


def test_transition_time_kept_while_status_holds_even_if_reason_changes() -> None:
    before = merge_conditions(None, [ConditionState("Ready", "True", "A")], generation=1, now=T0)
    after = merge_conditions(before, [ConditionState("Ready", "True", "B", "m")], generation=2, now=T1)
    assert after == [{"type": "Ready", "status": "True", "reason": "B", "message": "m", "lastTransitionTime": T0,
                      "observedGeneration": 2}]


def test_transition_time_moves_when_status_changes() -> None:
    before = merge_conditions(None, [ConditionState("Ready", "True", "A")], generation=1, now=T0)
    after = merge_conditions(before, [ConditionState("Ready", "False", "A")], generation=1, now=T1)
    assert after[0]["lastTransitionTime"] == T1


# ---- usage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_hold_nothing(phase) -> None:
    assert pod_slices(pod("p", "n", container("c", device("g", 1, 1)), phase=phase)) is None


def test_pods_without_a_record_hold_nothing() -> None:
    assert pod_slices({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}, "status": {}}) is None


def test_an_undecodable_record_is_kept_with_its_error() -> None:
    held = pod_slices(pod("p", "n", annotation="{not json"))
    assert held is not None and held.error and "not JSON" in held.error


# ---- pool status -----------------------------------------------------------------------------------


def inventory(node: str, *gpus: tuple[str, int, int, bool]) -> Inventory:
    return Inventory(node, tuple(GpuSummary(gpu_id, cus, vram, healthy) for gpu_id, cus, vram, healthy in gpus))


def facts(**overrides) -> PoolFacts:
    base = dict(generation=3, members=["n1", "n2"], conflicting=[],
                inventories={"n1": inventory("n1", ("g1", 104, 65520, True), ("g2", 104, 65520, False)),
                             "n2": inventory("n2", ("g3", 304, 196592, True))},
                pods_by_node={"n1": [pod_slices(pod("p1", "n1", container("c", device("g1", 8192, 26))))],
                              "n2": [pod_slices(pod("p2", "n2", container("c", device("g3", 196592, 304,
                                                                                      whole=True))))]})
    return PoolFacts(**{**base, **overrides})


def test_pool_status_sums_nodes_gpus_vram_and_allocations() -> None:
    status = pool_status(facts(), previous_conditions=None, now=T0)
    assert {k: status[k] for k in ("nodes", "gpusTotal", "gpusHealthy", "vramTotalMiB", "vramAllocatedMiB",
                                   "coresAllocatedPercent", "observedGeneration", "conflictingNodes")} == {
        "nodes": 2, "gpusTotal": 3, "gpusHealthy": 2, "vramTotalMiB": 65520 * 2 + 196592,
        "vramAllocatedMiB": 8192 + 196592, "coresAllocatedPercent": 25 + 100, "observedGeneration": 3,
        "conflictingNodes": []}
    ready, degraded = status["conditions"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "GpusAvailable", 3)
    assert (degraded["status"], degraded["reason"]) == ("True", "UnhealthyGpus")


@pytest.mark.parametrize(("overrides", "ready_reason", "degraded_reason"), [
    ({"members": [], "inventories": {}, "pods_by_node": {}}, "NoNodes", "AsExpected"),
    ({"members": [], "conflicting": ["n9"], "inventories": {}}, "NoNodes", "NodeConflicts"),
    ({"inventories": {}}, "NoGpusReported", "NodesNotReporting"),
    ({"inventories": {"n1": inventory("n1", ("g1", 104, 1, False))}}, "NoHealthyGpus", "UnhealthyGpus"),
    ({"problem": "name too long"}, "InvalidPool", "UnhealthyGpus"),
])
def test_pool_conditions(overrides, ready_reason, degraded_reason) -> None:
    ready, degraded = pool_status(facts(**overrides), previous_conditions=None, now=T0)["conditions"]
    assert (ready["reason"], degraded["reason"]) == (ready_reason, degraded_reason)


def test_undecodable_records_degrade_the_pool_and_are_not_summed() -> None:
    bad = pod_slices(pod("bad", "n1", annotation='{"version": 2}'))
    status = pool_status(facts(pods_by_node={"n1": [bad]}), previous_conditions=None, now=T0)
    assert status["vramAllocatedMiB"] == 0
    assert "1 pod(s) whose allocation cannot be read" in status["conditions"][1]["message"]


def test_events_not_handled_yet_degrade_the_pool() -> None:
    status = pool_status(facts(inventories={"n1": inventory("n1", ("g1", 104, 65520, True))},
                               members=["n1"], pods_by_node={},
                               events_failing=["pods ns/p: RuntimeError('bug')"]), previous_conditions=None, now=T0)
    degraded = status["conditions"][1]
    assert (degraded["status"], degraded["reason"]) == ("True", "EventsNotHandled")
    assert "1 watch event(s) not handled yet, retrying: pods ns/p: RuntimeError('bug')" in degraded["message"]


def test_unchanged_pool_status_is_identical_so_nothing_is_written() -> None:
    first = pool_status(facts(), previous_conditions=None, now=T0)
    assert pool_status(facts(), previous_conditions=first["conditions"], now=T1) == first


# ---- shares ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limits", "hard"), [
    ({"memoryMiB": 8192, "coresPercent": 250, "gpus": 4},
     {"limits.amd.com/gpumem": "8192", "limits.amd.com/gpucores": "250", "requests.amd.com/gpu": "4"}),
    ({"memoryMiB": 0}, {"limits.amd.com/gpumem": "0"}),
    ({}, {}),
])
def test_quota_lists_only_the_limits_set(limits, hard) -> None:
    assert quota_hard(ShareLimits.model_validate(limits)) == hard


@pytest.mark.parametrize(("limits", "used"), [
    ({"memoryMiB": 8192, "coresPercent": 250, "gpus": 4},
     {"limits.amd.com/gpumem": "6144", "limits.amd.com/gpucores": "35"}),  # GPUs: Kubernetes counts them
    ({"memoryMiB": 0}, {"limits.amd.com/gpumem": "6144"}),
    ({"gpus": 4}, {}),
])
def test_the_quota_used_rocshare_writes_is_the_records_for_each_limits_entry(limits, used) -> None:
    """Issue 43: the quota's used follows the records (a resized pod's record, not its immutable
    spec), for exactly the `limits.` entries of its hard, which Kubernetes never counts."""
    held = ShareUsage(memory_mib=6144, cores_pct=35, gpus=3)
    shown = quota_used(ShareLimits.model_validate(limits), held)
    assert shown == used
    assert set(shown) <= set(quota_hard(ShareLimits.model_validate(limits)))
    assert all(key.startswith("limits.") for key in shown)


@pytest.mark.parametrize(("seen", "differs"), [
    ({"limits.amd.com/gpumem": "16k", "limits.amd.com/gpucores": "40"}, False),  # the API server's canonical form
    ({"limits.amd.com/gpumem": "16000", "limits.amd.com/gpucores": "40"}, False),
    ({"limits.amd.com/gpumem": "8000", "limits.amd.com/gpucores": "40"}, True),  # the spec's figure, say
    ({"limits.amd.com/gpumem": "16000"}, True),
    ({"limits.amd.com/gpumem": "garbage", "limits.amd.com/gpucores": "40"}, True),
    ({}, True),
])
def test_the_quota_used_is_written_again_only_when_its_figures_differ(seen, differs) -> None:
    assert quota_used_differs(seen, {"limits.amd.com/gpumem": "16000", "limits.amd.com/gpucores": "40"}) is differs


def test_quota_body_is_owned_by_the_share() -> None:
    body = quota_body(share="team", namespace="ns", uid="u1", limits=ShareLimits(gpus=1))
    assert body["metadata"]["name"] == "rocshare-team"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuShare",
                                                    "name": "team", "uid": "u1", "controller": True,
                                                    "blockOwnerDeletion": True}]


def test_long_share_names_give_valid_unique_quota_names() -> None:
    one, two = quota_name("a" * 253), quota_name("a" * 252 + "b")
    assert len(one) <= 253 and len(two) <= 253 and one != two


def share(pods, *, inventories=None) -> dict:
    return share_status(share="team", generation=1, pods=pods,
                        inventories=inventories or {}, previous_conditions=None, now=T0)


def test_share_usage_and_holders() -> None:
    held = pod_slices(pod("trainer", "n1", container("c", device("g1", 4096, 76), device("g2", 4096, 76))))
    status = share([held], inventories={"n1": inventory("n1", ("g1", 304, 1, True), ("g2", 304, 1, True))})
    assert status["used"] == {"memoryMiB": 8192, "coresPercent": 50, "gpus": 2}
    assert status["pods"] == [{"pod": "trainer", "node": "n1", "gpuIds": ["g1", "g2"], "memoryMiB": 8192,
                               "cuCount": 152}]
    assert (status["podsTotal"], status["quotaName"]) == (1, "rocshare-team")
    assert (status["conditions"][0]["status"], status["conditions"][0]["reason"]) == ("True", "QuotaApplied")


def test_share_pod_list_is_bounded_but_counted() -> None:
    pods = [pod_slices(pod(f"p{i:04d}", "n1", container("c", device("g", 1, 1)))) for i in range(250)]
    status = share(pods)
    assert len(status["pods"]) == PODS_LISTED_MAX and status["podsTotal"] == 250
    assert status["pods"][0]["pod"] == "p0000"


def test_a_pod_that_cannot_be_accounted_for_makes_the_share_not_ready_and_is_not_summed() -> None:
    good = pod_slices(pod("good", "n1", container("c", device("g1", 4096, 76))))
    bad = pod_slices(pod("bad", "n1", annotation='{"version": 1, "node": "n1", "containers": "x"}'))
    status = share([good, bad], inventories={"n1": inventory("n1", ("g1", 304, 1, True))})
    assert status["used"] == {"memoryMiB": 4096, "coresPercent": 25, "gpus": 1}
    ready = status["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "UnaccountablePods")
    assert "bad (" in ready["message"] and "no new pod" in ready["message"]
