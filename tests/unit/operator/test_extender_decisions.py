"""Filter and prioritize on a SchedulerState built in memory (no Kubernetes), and the plan memo
behind them: the memoised answers equal a fresh plan on every node, and a memo never outlives
the ledger version, inventory or pool policy it was computed from (commit, release, a GPU
turning unhealthy, a pool switching policy). The memo holds answers, never capacity: two
pods committed one after the other never get the same room.
"""

from __future__ import annotations

import random

import orjson
import pytest

from rocshare.api.models import API_VERSION, GpuInfo
from rocshare.api.node_settings import POOL_LABEL
from rocshare.core.allocate import allocate, plan_pod
from rocshare.core.fit import FitFailure
from rocshare.core import ledger as ledger_module
from rocshare.core.ids import pod_key
from rocshare.core.ledger import Ledger
from rocshare.core.policies import NodeScorer, normalize_scores
from rocshare.core.request import ContainerRequest, PodRequest, Selection
from rocshare_operator.extender import decisions
from rocshare_operator.extender.decisions import (
    NO_INVENTORY, Rejection, best_nodes, filter_nodes, node_rejection, policy_for, prioritize)
from rocshare_operator.extender.state import NodeMemo, SchedulerState

NAMESPACE = "team"


def gpu(node: str, index: int, *, cus: int = 104, vram_mib: int = 65536, healthy: bool = True) -> GpuInfo:
    return GpuInfo.model_validate({
        "id": f"GPU-{node}-{index}", "index": index, "product": "AMD Instinct MI210", "gfxTargetVersion": 90010,
        "vramMiB": vram_mib, "cuCount": cus, "pciBDF": f"0000:{index + 1:02x}:00.0", "numa": index // 4,
        "xgmiPeers": [f"0000:{peer + 1:02x}:00.0" for peer in range(4 * (index // 4), 4 * (index // 4) + 4)
                      if peer != index],
        "splitCount": 10, "healthy": healthy})


def add_node(state: SchedulerState, name: str, *, gpus: int = 4, pool: str = "p", unhealthy: tuple[int, ...] = ()):
    state.on_node("ADDED", {"metadata": {"name": name, "labels": {POOL_LABEL: pool}},
                            "status": {"allocatable": {"amd.com/gpu": str(gpus)}}})
    infos = [gpu(name, i, healthy=i not in unhealthy).model_dump(by_alias=True) for i in range(gpus)]
    state.on_gpu_node("MODIFIED", {"metadata": {"name": name}, "status": {"gpus": infos}})


def set_pool(state: SchedulerState, name: str, **scheduling) -> None:
    state.on_pool("MODIFIED", {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
                               "spec": {"nodeSelector": {POOL_LABEL: name}, "scheduling": scheduling}})


def request(name: str = "pod", *, gpus: int = 1, memory_mib: int | None = None, cores_pct: int | None = None,
            uuids: frozenset[str] = frozenset()) -> PodRequest:
    container = ContainerRequest("main", False, gpus, memory_mib=memory_mib, cores_pct=cores_pct)
    return PodRequest(NAMESPACE, name, (container,), Selection(use_uuids=uuids))


def commit(state: SchedulerState, pod: PodRequest, node: str) -> None:
    inventory = state.inventories[node]
    record = allocate(inventory, state.ledger.usage(inventory), pod, policy_for(state.snapshot(), node, pod))
    assert not isinstance(record, FitFailure), record
    state.commit(pod_key(NAMESPACE, pod.name), NAMESPACE, record)


async def release(state: SchedulerState, pod: PodRequest) -> None:
    await state.on_pod("DELETED", {"metadata": {"namespace": NAMESPACE, "name": pod.name}})


def fresh_scores(state: SchedulerState, pod: PodRequest, names: list[str]) -> dict[str, float]:
    """The reference prioritize: the core's plan_pod on every node, no memo."""
    raw = {}
    for name in names:
        node = state.inventories.get(name)
        if node is not None:
            plan = plan_pod(node, state.ledger.usage(node), pod, policy_for(state.snapshot(), name, pod))
            if not isinstance(plan, FitFailure):
                raw[name] = plan.score
    return raw


@pytest.fixture
def state() -> SchedulerState:
    state = SchedulerState()
    set_pool(state, "p")
    for name in ("n1", "n2", "n3"):
        add_node(state, name)
    return state


def feasible(state: SchedulerState, pod: PodRequest, names=("n1", "n2", "n3")) -> list[str]:
    return filter_nodes(state.snapshot(), pod, list(names)).feasible


# ---- the memo agrees with a fresh plan ---------------------------------------------------------


async def test_memoised_filter_and_prioritize_match_a_fresh_plan_through_random_churn() -> None:
    rng = random.Random(3)
    state = SchedulerState()
    set_pool(state, "p")
    names = [f"n{i}" for i in range(12)]
    for name in names:
        add_node(state, name, gpus=rng.choice((2, 4, 8)))
    shapes = [dict(memory_mib=16384, cores_pct=25), dict(memory_mib=8192, cores_pct=10), dict(gpus=2),
              dict(gpus=1), dict(memory_mib=4096), dict(gpus=2, memory_mib=20480, cores_pct=30)]
    live: list[tuple[PodRequest, str]] = []
    for serial in range(300):
        pod = request(f"p{serial}", **rng.choice(shapes))
        result = filter_nodes(state.snapshot(), pod, names + ["missing"])
        for name in names + ["missing"]:
            assert result.failed.get(name) == node_rejection(state.snapshot(), pod, name), (serial, name)
        scores = prioritize(state.snapshot(), pod, result.feasible).scores()
        expected = normalize_scores(fresh_scores(state, pod, result.feasible))
        assert scores == {name: expected.get(name, 0) for name in result.feasible}
        if result.feasible and rng.random() < 0.7:
            node = rng.choice(result.feasible)
            commit(state, pod, node)
            live.append((pod, node))
        if live and rng.random() < 0.4:
            await release(state, live.pop(rng.randrange(len(live)))[0])


def place_and_compare(state: SchedulerState, names: list[str], rng: random.Random, *, pods: int) -> None:
    """Place `pods` random slices one by one; every prioritize must equal a fresh plan's scores."""
    for serial in range(pods):
        pod = request(f"p{serial}", memory_mib=rng.choice((2048, 8192)), cores_pct=rng.choice((10, 25)))
        result = filter_nodes(state.snapshot(), pod, names)
        scores = prioritize(state.snapshot(), pod, result.feasible).scores()
        expected = normalize_scores(fresh_scores(state, pod, result.feasible))
        assert scores == {name: expected.get(name, 0) for name in result.feasible}, serial
        commit(state, pod, rng.choice(result.feasible))


EXTENDER_WEIGHT = 1000
"""The weight the profile gave prioritize before filter kept only the best nodes."""
PLUGINS_MAX = 1300
"""kube-scheduler's score plugins left on, all at their maximum (docs/placement.md)."""


def kube_scheduler_pick(feasible: list[str], plugins: dict[str, int], levels: dict[str, int] | None = None) -> str:
    """kube-scheduler's choice: the extender's level x 10 x its weight (when it has a prioritize)
    plus its own plugins' score (here distinct per node, so the pick is unique)."""
    levels = levels or {}
    return max(feasible, key=lambda name: 10 * EXTENDER_WEIGHT * levels.get(name, 0) + plugins[name])


async def test_filter_keeping_the_best_nodes_leaves_kube_schedulers_pick_as_prioritize_made_it() -> None:
    """Through random churn, with binds under way: the node kube-scheduler picks among filter's best
    nodes by its own plugins is the node it picked when prioritize scored every feasible node (its
    levels less the binds under way, not clamped at 0: see the next test). Only nodes ranked lower
    are left out, and they are not reported as failed."""
    rng = random.Random(11)
    state = SchedulerState()
    set_pool(state, "p", nodePolicy=rng.choice(("binpack", "spread")))
    names = [f"n{i}" for i in range(16)]
    for name in names:
        add_node(state, name, gpus=rng.choice((2, 4, 8)))
    narrowed = 0
    for serial in range(250):
        pod = request(f"p{serial}", memory_mib=rng.choice((2048, 8192, 16384)), cores_pct=rng.choice((10, 25, None)),
                      gpus=rng.choice((1, 1, 2)))
        queued = {name: rng.randint(1, 2) for name in rng.sample(names, 3)}
        plugins = dict(zip(names, rng.sample(range(PLUGINS_MAX + 1), len(names))))
        full = filter_nodes(state.snapshot(), pod, names)
        best = best_nodes(state.snapshot(), pod, names, queued)
        assert best.failed == full.failed and set(best.feasible) <= set(full.feasible)
        if full.feasible:
            levels = {name: level - queued.get(name, 0)
                      for name, level in prioritize(state.snapshot(), pod, full.feasible).scores().items()}
            assert kube_scheduler_pick(best.feasible, plugins) == kube_scheduler_pick(full.feasible, plugins, levels)
            assert len({levels[name] for name in best.feasible}) == 1
            narrowed += len(best.feasible) < len(full.feasible)
            commit(state, pod, rng.choice(best.feasible))
        if rng.random() < 0.3 and state.ledger.records():
            key = rng.choice(list(state.ledger.records()))
            await release(state, request(key.partition("/")[2]))
    assert narrowed > 100  # the test saw filter leave nodes out, not only trivial replies


def test_binds_under_way_steer_pods_away_even_when_every_node_ties(state: SchedulerState) -> None:
    """All nodes alike (every level 0) and binds queued on all of them, most on n1: the nodes with
    the fewest binds waiting are kept. Clamped at 0, as prioritize's scores are, all three would tie
    and kube-scheduler's MostAllocated -- which counts the pods sent to bind -- would pick n1 again."""
    pod = request(memory_mib=1024, cores_pct=10)
    assert best_nodes(state.snapshot(), pod, ["n1", "n2", "n3"], {"n1": 5, "n2": 1, "n3": 2}).feasible == ["n2"]
    assert set(best_nodes(state.snapshot(), pod, ["n1", "n2", "n3"], {"n1": 5}).feasible) == {"n2", "n3"}


def test_best_nodes_of_a_pod_that_fits_one_node_or_none_are_filters(state: SchedulerState) -> None:
    commit(state, request("big", gpus=4), "n1")
    commit(state, request("big2", gpus=4), "n2")
    whole = request(gpus=1)
    assert best_nodes(state.snapshot(), whole, ["n1", "n2", "n3"], {"n3": 5}) == \
        filter_nodes(state.snapshot(), whole, ["n1", "n2", "n3"])
    assert best_nodes(state.snapshot(), request(gpus=8), ["n1", "n2", "n3"]).feasible == []


async def test_nodes_of_pools_with_different_policies_are_answered_by_their_own() -> None:
    rng = random.Random(5)
    state = SchedulerState()
    set_pool(state, "pack")
    set_pool(state, "spread", nodePolicy="spread", gpuPolicy="spread")
    names = [f"n{i}" for i in range(10)]
    for index, name in enumerate(names):
        add_node(state, name, pool=("pack", "spread", "unknown-pool")[index % 3])
    place_and_compare(state, names, rng, pods=40)


@pytest.mark.parametrize("strays", [(), ("unknown-pool",), ("",)])
async def test_one_pool_answers_its_nodes_and_the_default_answers_strays(strays: tuple[str, ...]) -> None:
    """With one pool, its policy answers every node at once -- unless some node has no pool label or
    one naming no known pool: that node takes the default (binpack) policy."""
    rng = random.Random(9)
    state = SchedulerState()
    set_pool(state, "spread", nodePolicy="spread", gpuPolicy="spread")
    names = [f"n{i}" for i in range(6)]
    for index, name in enumerate(names):
        add_node(state, name, pool=strays[0] if strays and index == 5 else "spread")
    assert (policy_for(state.snapshot(), "n5", request()).node == NodeScorer.BINPACK) == bool(strays)
    place_and_compare(state, names, rng, pods=20)


async def test_pool_membership_changing_between_decisions_is_seen_by_the_next() -> None:
    """Whether every node shares one policy is worked out once per change of membership: a node
    relabelled out of its pool, a pool deleted or created, each is seen by the very next decision."""
    rng = random.Random(4)
    state = SchedulerState()
    set_pool(state, "spread", nodePolicy="spread", gpuPolicy="spread")
    names = [f"n{i}" for i in range(6)]
    for name in names:
        add_node(state, name, pool="spread")
    place_and_compare(state, names, rng, pods=4)
    add_node(state, "n5", pool="")  # relabelled: no pool, the default policy
    assert policy_for(state.snapshot(), "n5", request()).node == NodeScorer.BINPACK
    place_and_compare(state, names, rng, pods=4)
    add_node(state, "n5", pool="later")  # a pool not created yet
    place_and_compare(state, names, rng, pods=4)
    set_pool(state, "later", nodePolicy="spread", gpuPolicy="spread")
    place_and_compare(state, names, rng, pods=4)
    state.on_pool("DELETED", {"metadata": {"name": "spread"}})
    place_and_compare(state, names, rng, pods=4)


def test_nodes_failing_alike_share_one_rendered_rejection(state: SchedulerState) -> None:
    for name in ("n1", "n2"):
        commit(state, request(f"whole-{name}", gpus=4), name)
    result = filter_nodes(state.snapshot(), request(memory_mib=1024), ["n1", "n2", "gone", "also-gone"])
    assert result.failed["n1"] is result.failed["n2"]
    assert result.failed["gone"] is result.failed["also-gone"]
    assert result.to_json()["FailedNodes"]["n2"] == "4/4 ExclusiveDeviceAllocateConflict"
    assert result.reason_counts() == {"ExclusiveDeviceAllocateConflict": 2, NO_INVENTORY: 2}


def test_rejection_text_names_reasons_per_gpu(state: SchedulerState) -> None:
    pod = request(gpus=8)
    result = filter_nodes(state.snapshot(), pod, ["n1", "nowhere"])
    assert result.to_json()["FailedNodes"] == {
        "n1": "4/4 NodeInsufficientGPUs", "nowhere": f"0/0 {NO_INVENTORY}"}


# ---- invalidation ------------------------------------------------------------------------------


async def test_a_commit_takes_the_room_at_once_and_a_release_gives_it_back(state: SchedulerState) -> None:
    whole = request("big", gpus=4)
    assert feasible(state, whole) == ["n1", "n2", "n3"]
    commit(state, whole, "n1")
    second = request("second", gpus=4)
    assert feasible(state, second) == ["n2", "n3"]  # the same shape, memoised before the commit
    assert node_rejection(state.snapshot(), second, "n1") is not None
    await release(state, whole)
    assert feasible(state, second) == ["n1", "n2", "n3"]


def test_two_pods_never_get_the_same_room(state: SchedulerState) -> None:
    names = ["n1"]
    for serial in range(10):  # 4 GPUs x 10 slices of 25 %: 16 quarter-pods fit by cores
        pod = request(f"q{serial}", memory_mib=1024, cores_pct=25)
        if feasible(state, pod, names):
            commit(state, pod, "n1")
    usage = state.ledger.usage(state.inventories["n1"])
    assert all(gpu.cu_held <= 104 for gpu in usage.gpus)
    assert sum(gpu.slices for gpu in usage.gpus) == 10


def test_a_gpu_turning_unhealthy_drops_the_nodes_memo(state: SchedulerState) -> None:
    pod = request(gpus=4)
    assert "n2" in feasible(state, pod)
    add_node(state, "n2", unhealthy=(3,))
    assert feasible(state, pod) == ["n1", "n3"]
    assert filter_nodes(state.snapshot(), pod, ["n2"]).failed["n2"].text() == "1/4 CardNotHealth, 3/4 NodeInsufficientGPUs"


def test_a_node_losing_its_gpus_or_pool_answers_accordingly(state: SchedulerState) -> None:
    pod = request(memory_mib=1024, cores_pct=10)
    assert feasible(state, pod) == ["n1", "n2", "n3"]
    state.on_gpu_node("DELETED", {"metadata": {"name": "n3"}})
    assert feasible(state, pod) == ["n1", "n2"]
    assert not state.plans.holds("n3") and state.plans.holds("n1")


def test_a_node_is_offered_only_once_its_kubelet_lists_the_devices(state: SchedulerState) -> None:
    """The agent publishes its AmdGpuNode before its device plugin registers; a pod bound in between
    would start with no GPU (the kubelet drops a resource it does not know). So a node whose
    allocatable lists no amd.com/gpu is not offered, and is as soon as it lists them."""
    pod = request(memory_mib=1024, cores_pct=10)
    state.on_node("MODIFIED", {"metadata": {"name": "n3", "labels": {POOL_LABEL: "p"}}, "status": {"allocatable": {}}})
    assert feasible(state, pod) == ["n1", "n2"]
    add_node(state, "n3")
    assert feasible(state, pod) == ["n1", "n2", "n3"]


def test_a_node_is_not_offered_while_its_agent_says_the_kubelet_lacks_the_device_list(state: SchedulerState) -> None:
    """An agent restart: the old plugin's socket is gone, so the kubelet holds the devices unhealthy
    and fails any pod bound there, while its allocatable (posted every 10 s) still lists them. The
    agent says so (DevicePlugin False) and the node is not offered until it says True again; waiting
    pods are woken then."""
    pod = request(memory_mib=1024, cores_pct=10)
    woken: list[tuple[str, bool]] = []
    state.index.on_inventory.append(lambda name, offers: woken.append((name, offers)))
    infos = [gpu("n3", i).model_dump(by_alias=True) for i in range(4)]

    def plugin(status: str, reason: str) -> None:
        state.on_gpu_node("MODIFIED", {"metadata": {"name": "n3"}, "status": {"gpus": infos, "conditions": [
            {"type": "Ready", "status": "True", "reason": "GpusFound"},
            {"type": "DevicePlugin", "status": status, "reason": reason}]}})

    plugin("False", "AgentStopping")
    assert feasible(state, pod) == ["n1", "n2"]
    assert filter_nodes(state.snapshot(), pod, ["n3"]).failed["n3"].text() == f"0/0 {NO_INVENTORY}"
    plugin("False", "NotWatched")
    assert feasible(state, pod) == ["n1", "n2"]
    plugin("True", "Serving")
    assert feasible(state, pod) == ["n1", "n2", "n3"]
    assert woken == [("n3", False), ("n3", True)]


def test_the_priorities_are_written_as_kube_schedulers_host_priority_list() -> None:
    """The reply text is built without a dict per node: it must still be the list kube-scheduler
    reads, names JSON-quoted whatever they hold, and a queue penalty never goes below 0."""
    names = ["n1", 'odd"name\\', "ünï", "n4"]
    priorities = decisions.Priorities(names, [10, 3, 0, 7])
    assert orjson.loads(orjson.dumps(priorities.to_json())) == [
        {"Host": "n1", "Score": 10}, {"Host": 'odd"name\\', "Score": 3}, {"Host": "ünï", "Score": 0},
        {"Host": "n4", "Score": 7}]
    assert priorities.lowered({"n1": 4, "n4": 9}).scores() == {"n1": 6, 'odd"name\\': 3, "ünï": 0, "n4": 0}
    assert orjson.loads(orjson.dumps(decisions.Priorities([], []).to_json())) == []


def test_a_pool_switching_policy_changes_the_scores(state: SchedulerState) -> None:
    commit(state, request("busy", memory_mib=32768, cores_pct=50), "n2")
    pod = request(memory_mib=1024, cores_pct=10)
    binpack = prioritize(state.snapshot(), pod, ["n1", "n2", "n3"]).scores()
    assert max(binpack, key=binpack.get) == "n2"
    set_pool(state, "p", nodePolicy="spread")
    spread = prioritize(state.snapshot(), pod, ["n1", "n2", "n3"]).scores()
    assert spread["n2"] == 0 and spread["n1"] == spread["n3"] == 10


def test_quota_is_read_fresh_on_every_call(state: SchedulerState) -> None:
    pod = request(memory_mib=8192, cores_pct=10)
    assert feasible(state, pod) == ["n1", "n2", "n3"]
    state.on_quota("ADDED", {"metadata": {"namespace": NAMESPACE, "name": "q"},
                             "spec": {"hard": {"limits.amd.com/gpumem": "4096"}}})
    result = filter_nodes(state.snapshot(), pod, ["n1", "n2"])
    assert result.feasible == [] and all("ResourceQuotaNotFit" in r.text() for r in result.failed.values())
    state.on_quota("DELETED", {"metadata": {"namespace": NAMESPACE, "name": "q"}})
    assert feasible(state, pod) == ["n1", "n2", "n3"]


def test_a_uuid_pinned_pod_is_not_answered_from_a_look_alike_node(state: SchedulerState) -> None:
    pinned = request(memory_mib=1024, cores_pct=10, uuids=frozenset({"gpu-n2-1"}))
    assert feasible(state, pinned) == ["n2"]
    assert isinstance(filter_nodes(state.snapshot(), pinned, ["n1"]).failed["n1"], Rejection)


# ---- what the memo saves -----------------------------------------------------------------------


def count_plans(monkeypatch) -> list[int]:
    """Nodes the decisions module plans (the core's allocate, used by `commit`, is not counted)."""
    calls = [0]

    class Counted(decisions.PodPlanner):
        def plan(self, *args, **kwargs):
            calls[0] += 1
            return super().plan(*args, **kwargs)

    monkeypatch.setattr(decisions, "PodPlanner", Counted)
    return calls


def test_prioritize_after_filter_and_look_alike_nodes_plan_nothing_again(state: SchedulerState, monkeypatch) -> None:
    calls = count_plans(monkeypatch)
    pod = request(memory_mib=2048, cores_pct=20)
    result = filter_nodes(state.snapshot(), pod, ["n1", "n2", "n3"])
    assert calls[0] == 1  # three nodes of one shape, all empty: one plan
    prioritize(state.snapshot(), pod, result.feasible)
    filter_nodes(state.snapshot(), request("next-of-same-shape", memory_mib=2048, cores_pct=20), ["n1", "n2", "n3"])
    assert calls[0] == 1
    commit(state, pod, "n1")
    filter_nodes(state.snapshot(), pod, ["n1", "n2", "n3"])
    assert calls[0] == 2  # only the changed node


def test_bind_checks_plan_afresh(state: SchedulerState, monkeypatch) -> None:
    pod = request(memory_mib=2048, cores_pct=20)
    filter_nodes(state.snapshot(), pod, ["n1"])
    calls = count_plans(monkeypatch)
    assert node_rejection(state.snapshot(), pod, "n1") is None
    assert calls[0] == 1


def test_memo_is_bounded(monkeypatch) -> None:
    memo, ledger = NodeMemo(), Ledger()
    first = memo.answers(("shape", 0), ledger)
    first.store("n1", 1.0)
    for key in range(1, NodeMemo.MAX_KEYS):
        memo.answers(("shape", key), ledger)
    assert memo.answers(("shape", 0), ledger) is first and memo.holds("n1")
    assert not memo.answers(("one", "more"), ledger).holds("n1")  # past the key limit everything is dropped
    assert memo.answers(("shape", 0), ledger) is not first and not memo.holds("n1")
    monkeypatch.setattr(NodeMemo, "MAX_SHARED", 3)
    kept = memo.answers(("shape", 0), ledger)
    for serial in range(3):
        memo.share(kept, ("loads", serial), float(serial))
    assert len(kept.by_shape) == 3
    memo.share(memo.answers(("one", "more"), ledger), ("loads", 9), 9.0)  # past the shape limit those are dropped
    assert kept.by_shape == {} and memo.answers(("one", "more"), ledger).by_shape == {("loads", 9): 9.0}


def test_answers_go_stale_with_the_ledger_changes_since_the_last_look(state: SchedulerState, monkeypatch) -> None:
    """A key unused while other shapes' pods came and went replans exactly the nodes changed
    meanwhile, and its answers equal a fresh plan."""
    calls = count_plans(monkeypatch)
    big = request("big", memory_mib=40000, cores_pct=60)
    filter_nodes(state.snapshot(), big, ["n1", "n2", "n3"])
    planned = calls[0]
    for serial in range(3):  # another shape's pods come and go on n1 only
        commit(state, request(f"s{serial}", memory_mib=30000, cores_pct=30), "n1")
    state.accounts.uncommit(pod_key(NAMESPACE, "s0"))
    feasible(state, request("small", memory_mib=1024, cores_pct=10))
    calls[0] = planned
    result = filter_nodes(state.snapshot(), big, ["n1", "n2", "n3"])
    assert calls[0] == planned + 1  # n1 alone
    fresh = {name: node_rejection(state.snapshot(), big, name) for name in ("n1", "n2", "n3")}
    assert result.feasible == [name for name, why in fresh.items() if why is None]
    assert {name: why.text() for name, why in result.failed.items()} == {
        name: why.text() for name, why in fresh.items() if why is not None}


def test_a_memo_behind_the_journal_or_of_another_ledger_starts_over(state: SchedulerState, monkeypatch) -> None:
    memo, ledger = NodeMemo(), state.ledger
    answers = memo.answers("key", ledger)
    answers.store("n1", 1.0)
    answers.store("n2", 2.0)
    commit(state, request("a", memory_mib=1024, cores_pct=10), "n2")
    answers = memo.answers("key", ledger)
    assert answers.holds("n1") and not answers.holds("n2")  # only the changed node went
    monkeypatch.setattr(ledger_module, "JOURNAL_MAX", 2)
    for serial in range(3):
        commit(state, request(f"b{serial}", memory_mib=1024, cores_pct=10), "n3")
    assert ledger.changed_since(answers.synced) is None
    assert not memo.answers("key", ledger).holds("n1")  # the journal dropped what it last saw
    memo.answers("key", ledger).store("n1", 1.0)
    assert not memo.answers("key", Ledger()).holds("n1")
