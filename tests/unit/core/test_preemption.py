"""Which pods preemption evicts (rocshare.core.preemption): one row per rule of the issue-40 order.

Every node here is filled by the real allocator (records in a real Ledger), so the victims are
read from the same holds filter and bind count; the expected victims are worked out by hand
from the slices each row places."""

from __future__ import annotations

import pytest

from rocshare.core.allocate import PodPlanner, allocate
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.preemption import (EXACT_LIMIT, NO_LOWER_PRIORITY, NOT_ENOUGH_EVEN_EMPTIED, NoVictims, PodTraits,
                                      Victims, best_node, choose_victims, occupants_of)
from rocshare.core.request import parse_pod

from .helpers import gpu, node, pod

POLICY = Policy()
LOW, MID, HIGH = 100, 1000, 10000


def fill(inv, slices):
    """`slices`: (key, limits, priority[, running_s[, pdb]]) placed in order; returns ledger, traits."""
    ledger, traits = Ledger(), {}
    for key, limits, priority, *rest in slices:
        record = allocate(inv, ledger.usage(inv), parse_pod(pod(limits, name=key)), POLICY)
        assert not isinstance(record, FitFailure), (key, record)
        ledger.apply(record, PodKey(f"ns/{key}"))
        running = rest[0] if rest else 60.0
        traits[f"ns/{key}"] = PodTraits(uid=f"uid-{key}", priority=priority, running_s=running,
                                        violates_pdb=bool(rest[1]) if len(rest) > 1 else False)
    return ledger, traits


def victims(inv, ledger, traits, limits, priority=HIGH, init=()):
    planner = PodPlanner(parse_pod(pod(limits, init=init, name="preemptor")), POLICY)
    return choose_victims(inv, ledger.usage(inv), occupants_of(ledger, inv, traits), planner, priority)


def names(found):
    assert isinstance(found, Victims), found
    return sorted(p.key.split("/")[1] for p in found.pods)


def quarter(extra=None):
    return {"amd.com/gpumem-percentage": 25, "amd.com/gpucores": 25, **(extra or {})}


def gpu_of(ledger, key):
    return ledger.record(PodKey(f"ns/{key}")).gpu_ids()[0]


def test_a_60_percent_slice_takes_exactly_what_it_needs_on_one_gpu():
    # Two GPUs, each full with four 25 % slices; 60 % needs three of one GPU's four.
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [(f"low{i}", quarter(), LOW) for i in range(8)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 60, "amd.com/gpucores": 60})
    assert len(found.pods) == 3
    assert len({gpu_of(ledger, name) for name in names(found)}) == 1
    assert found.plan.containers[0][0].position == inv.position_of(gpu_of(ledger, names(found)[0]))


@pytest.mark.parametrize("own", [HIGH, HIGH + 1])
def test_never_a_pod_of_equal_or_higher_priority(own):
    inv = node(gpu(0))
    ledger, traits = fill(inv, [("a", quarter(), own), ("b", quarter(), own), ("c", quarter(), LOW),
                                ("d", quarter(), LOW)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 60, "amd.com/gpucores": 60})
    assert isinstance(found, NoVictims) and found.reason == NOT_ENOUGH_EVEN_EMPTIED
    assert names(victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50})) == ["c", "d"]


def test_lower_priority_classes_go_before_middle_ones():
    # GPU0: two MID halves; GPU1: two LOW halves. A 50 % slice evicts one LOW, not one MID.
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [("m1", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID),
                                ("m2", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID),
                                ("l1", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW),
                                ("l2", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50})
    assert len(found.pods) == 1 and found.pods[0].priority == LOW


def test_one_middle_pod_rather_than_two_when_the_lows_cannot_make_room():
    # GPU0: one MID 50 % + two LOW 25 %; the preemptor needs 75 %: the MID alone frees too little,
    # both LOWs too: the cheapest set is one MID + one LOW (fewest pods of the top priority: 1).
    inv = node(gpu(0))
    ledger, traits = fill(inv, [("m", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID),
                                ("l1", quarter(), LOW), ("l2", quarter(), LOW)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 75, "amd.com/gpucores": 75})
    assert names(found) == ["l1", "m"]
    assert (found.top_priority, found.at_top) == (MID, 1)


def test_fewer_pods_before_less_gpu_time():
    # GPU0: one 50 % slice that ran an hour; GPU1: two 25 % slices that ran a minute.
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [("big", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW, 3600.0),
                                ("fill0", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, HIGH),
                                ("s1", quarter(), LOW, 60.0), ("s2", quarter(), LOW, 60.0),
                                ("fill1", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, HIGH)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50})
    assert names(found) == ["big"]


def test_less_gpu_time_lost_breaks_the_tie():
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [("old", quarter(), LOW, 7200.0), ("f0", {"amd.com/gpumem-percentage": 75,
                                                                         "amd.com/gpucores": 75}, HIGH),
                                ("young", quarter(), LOW, 30.0), ("f1", {"amd.com/gpumem-percentage": 75,
                                                                         "amd.com/gpucores": 75}, HIGH)])
    found = victims(inv, ledger, traits, quarter())
    assert names(found) == ["young"]
    assert found.gpu_milli_s == 250 * 30


def test_pdb_violations_count_first():
    # The young pod is protected by a PDB: the old one goes although it lost more GPU time.
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [("old", quarter(), LOW, 7200.0), ("f0", {"amd.com/gpumem-percentage": 75,
                                                                         "amd.com/gpucores": 75}, HIGH),
                                ("young", quarter(), LOW, 30.0, True), ("f1", {"amd.com/gpumem-percentage": 75,
                                                                                "amd.com/gpucores": 75}, HIGH)])
    found = victims(inv, ledger, traits, quarter())
    assert names(found) == ["old"] and found.pdb_violations == 0


def test_no_victim_on_a_gpu_the_preemptor_cannot_use():
    # GPU 0 is full of HIGH slices; the LOW pod "x" sits on GPU 1. Healthy, GPU 1 is the place:
    # "x" goes. Once GPU 1 is unhealthy, evicting "x" frees nothing usable: no candidate.
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [(f"h{i}", quarter(), HIGH) for i in range(4)] + [("x", quarter(), LOW)])
    assert gpu_of(ledger, "x") == inv.gpus[1].gpu_id
    most = {"amd.com/gpumem-percentage": 90, "amd.com/gpucores": 90}
    assert names(victims(inv, ledger, traits, most)) == ["x"]
    sick = node(gpu(0), gpu(1, healthy=False))
    found = victims(sick, ledger, traits, most)
    assert isinstance(found, NoVictims) and found.reason == NO_LOWER_PRIORITY


def test_a_pod_on_a_filtered_out_gpu_is_never_a_victim():
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [(f"h{i}", quarter(), HIGH) for i in range(4)] + [("x", quarter(), LOW)])
    assert gpu_of(ledger, "x") == inv.gpus[1].gpu_id
    limits = {"amd.com/gpumem-percentage": 90, "amd.com/gpucores": 90}
    only_gpu0 = {"amd.com/use-gpu-uuid": inv.gpus[0].gpu_id}
    planner = PodPlanner(parse_pod(pod(limits, annotations=only_gpu0, name="preemptor")), POLICY)
    found = choose_victims(inv, ledger.usage(inv), occupants_of(ledger, inv, traits), planner, HIGH)
    assert isinstance(found, NoVictims) and found.reason == NO_LOWER_PRIORITY


def test_whole_gpu_request_needs_the_gpu_emptied():
    inv = node(gpu(0), gpu(1))
    ledger, traits = fill(inv, [("a", quarter(), LOW), ("b", quarter(), LOW), ("c", quarter(), LOW),
                                ("d", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW)])
    # Which GPU each slice went to is the allocator's; the whole GPU takes the one with fewest pods.
    by_gpu = {}
    for name in "abcd":
        by_gpu.setdefault(gpu_of(ledger, name), []).append(name)
    fewest = min(by_gpu.values(), key=len)
    assert names(victims(inv, ledger, traits, {"amd.com/gpu": 1})) == sorted(fewest)


def test_partitions_are_whole_devices():
    inv = node(gpu(0, partition=True, cu_count=38, memory_mib=24576), gpu(1, partition=True, cu_count=38,
                                                                             memory_mib=24576))
    ledger, traits = fill(inv, [("p0", {"amd.com/gpu": 1}, LOW, 10.0), ("p1", {"amd.com/gpu": 1}, LOW, 500.0)])
    found = victims(inv, ledger, traits, {"amd.com/gpumem": 100})
    assert names(found) == ["p0"]  # one whole partition, the one that lost less time


def test_init_containers_count_as_the_kubelet_counts_them():
    # The preemptor's init container asks 75 %, its app 25 %: it needs 75 % free on one GPU.
    inv = node(gpu(0))
    ledger, traits = fill(inv, [("a", quarter(), LOW), ("b", quarter(), LOW), ("c", quarter(), LOW),
                                ("d", quarter(), LOW)])
    found = victims(inv, ledger, traits, quarter(), init=({"amd.com/gpumem-percentage": 75,
                                                           "amd.com/gpucores": 75},))
    assert len(found.pods) == 3


def test_an_occupant_without_traits_is_never_evicted():
    inv = node(gpu(0))
    ledger, traits = fill(inv, [("a", quarter(), LOW), ("claim", quarter(), LOW)])
    del traits["ns/claim"]
    full = {"amd.com/gpumem-percentage": 80, "amd.com/gpucores": 80}
    assert names(victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50})) == ["a"]
    found = victims(inv, ledger, traits, full)
    assert isinstance(found, NoVictims) and found.reason == NOT_ENOUGH_EVEN_EMPTIED


def test_above_the_exact_limit_the_reprieve_still_gives_a_minimal_set():
    inv = node(*(gpu(i) for i in range(4)))
    slices = [(f"s{i}", {"amd.com/gpumem-percentage": 10, "amd.com/gpucores": 10}, LOW) for i in range(36)]
    ledger, traits = fill(inv, slices)
    found = victims(inv, ledger, traits, {"amd.com/gpumem-percentage": 30, "amd.com/gpucores": 30})
    assert EXACT_LIMIT < 36
    assert len(found.pods) == 3 and len({gpu_of(ledger, n) for n in names(found)}) == 1


def test_the_cheaper_node_wins():
    a, b = node(gpu(0, node="a"), name="a"), node(gpu(0, node="b"), name="b")
    la, ta = fill(a, [("a1", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID),
                      ("a2", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID)])
    lb, tb = fill(b, [("b1", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW),
                      ("b2", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW)])
    half = {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}
    found = [victims(a, la, ta, half), victims(b, lb, tb, half)]
    assert best_node(found).node == "b"


def test_pdb_rule_as_kube_scheduler_counts_it():
    from rocshare.core.preemption import budget_of, pdb_protected
    budgets = [budget_of({"metadata": {"namespace": "ns"}, "spec": {"selector": {"matchLabels": {"app": "a"}}},
                          "status": {"disruptionsAllowed": 1}}),
               budget_of({"metadata": {"namespace": "ns"}, "spec": {"selector": {}}, "status": {}}),
               budget_of({"metadata": {"namespace": "ns"}, "spec": {"selector": {"matchExpressions": [
                   {"key": "tier", "operator": "In", "values": ["gold"]}]}}, "status": {"disruptionsAllowed": 0}})]
    pods = [("ns/a1", "ns", {"app": "a"}), ("ns/a2", "ns", {"app": "a"}), ("other/a3", "other", {"app": "a"}),
            ("ns/g", "ns", {"tier": "gold"}), ("ns/s", "ns", {"tier": "silver"})]
    assert pdb_protected(pods, budgets) == {"ns/a2", "ns/g"}


def test_better_than_searches_only_what_can_beat_the_best_elsewhere():
    from rocshare.core.preemption import DEARER
    inv = node(gpu(0))
    ledger, traits = fill(inv, [("old", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, LOW, 600.0),
                                ("m", {"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, MID, 10.0)])
    planner = PodPlanner(parse_pod(pod({"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}, name="p")), POLICY)
    args = (inv, ledger.usage(inv), occupants_of(ledger, inv, traits), planner, HIGH)
    unbounded = choose_victims(*args)
    assert names(unbounded) == ["old"] and unbounded.gpu_milli_s == 500 * 600
    # Elsewhere one LOW victim that lost less: nothing here beats it.
    assert choose_victims(*args, better_than=(0, LOW, 1, 1, 500 * 60)) == NoVictims("n1", DEARER)
    # Elsewhere one LOW victim that lost more: "old" beats it.
    assert names(choose_victims(*args, better_than=(0, LOW, 1, 1, 500 * 6000))) == ["old"]
    # Elsewhere one MID victim: a LOW set here is cheaper whatever its size.
    assert names(choose_victims(*args, better_than=(0, MID, 1, 1, 1))) == ["old"]
