"""The cold path's structures (issue 18): each node's free shares kept with its ledger usage, GPU
twins, and the planner's per-shape verdicts and per-node twin scores. Each is checked against the
plain computation it replaces: free shares against `free_share_milli` of every GPU after every
apply and release; the planner, whose memos outlive one node, against the plain scan (every GPU
judged and scored on its own, free shares worked out from the loads), for every policy, with a
fragmentation model, over nodes whose loads change between the questions."""

from __future__ import annotations

import dataclasses
import random

from rocshare.api.models import GpuPolicy
from rocshare.core.allocate import PodPlanner, allocate, plan_pod
from rocshare.core.fit import FitFailure
from rocshare.core.fragmentation import FragmentationModel, TypicalTask, TypicalWorkload
from rocshare.core.headroom import free_share_milli, free_shares
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger, NodeUsage, empty_usage
from rocshare.core.policies import NodeScorer, Policy, ScoringContext, reads_headroom
from rocshare.core.request import ContainerRequest, PodRequest

from .helpers import gpu, node
from .test_planner import random_node, random_request

WORKLOAD = TypicalWorkload((TypicalTask(0, 1, 250, weight=0.5), TypicalTask(0, 1, 500, weight=0.3),
                            TypicalTask(0, 2, 1000, weight=0.2)))
CTX = ScoringContext(fragmentation=FragmentationModel(WORKLOAD))
PLAIN_CTX = ScoringContext(fragmentation=FragmentationModel(WORKLOAD))
"""The plain scan's own model: a model memoises per loads, so sharing one would hide a wrong free share."""
POLICIES = (Policy(), Policy(NodeScorer.SPREAD, GpuPolicy.SPREAD), Policy(gpu=GpuPolicy.TOPOLOGY_AWARE),
            Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE), Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE),
            Policy(NodeScorer.BESTFIT, GpuPolicy.BINPACK))


def slice_pod(rng: random.Random, serial: int) -> PodRequest:
    return PodRequest("ns", f"s{serial}", (ContainerRequest("c", False, rng.choice((1, 1, 2)),
                                                            memory_mib=rng.choice((None, 4096, 8192)),
                                                            cores_pct=rng.choice((None, 10, 25))),))


def plain_plan(inventory: NodeInventory, usage: NodeUsage, request: PodRequest, policy: Policy):
    """The plain scan: every GPU judged and scored on its own (no twins, and a uuid filter that
    bars nothing keeps verdicts per node), free shares worked out from the loads."""
    alone = dataclasses.replace(inventory)
    object.__setattr__(alone, "twins", tuple(range(len(alone.gpus))))
    selection = request.selection
    judged_alone = dataclasses.replace(request, selection=dataclasses.replace(
        selection, nouse_uuids=selection.nouse_uuids | {"gpu-that-is-nowhere"}))
    return plan_pod(alone, NodeUsage(usage.gpus, usage.cpu_milli, usage.memory_mib), judged_alone, policy, PLAIN_CTX)


def test_the_ledger_keeps_each_gpus_free_share_through_applies_and_releases() -> None:
    rng = random.Random(3)
    nodes = [random_node(rng, f"n{i}") for i in range(12)]
    ledger, live = Ledger(), []
    for serial in range(300):
        inventory = rng.choice(nodes)
        if live and rng.random() < 0.4:
            ledger.release(live.pop(rng.randrange(len(live))))
        else:
            record = allocate(inventory, ledger.usage(inventory), slice_pod(rng, serial), Policy())
            if not isinstance(record, FitFailure):
                key = PodKey(f"ns/s{serial}")
                ledger.apply(record, key)
                live.append(key)
        for each in nodes:
            usage = ledger.usage(each)
            assert usage.free_milli == tuple(free_share_milli(s, load) for s, load in zip(each.gpus, usage.loads))
    assert empty_usage(nodes[0]).free_milli == free_shares(nodes[0], empty_usage(nodes[0]).loads)


def test_twins_are_gpus_alike_but_for_numa_and_peers() -> None:
    inventory = node(gpu(0, numa=0, peers=(1,)), gpu(1, numa=1, peers=(0,)), gpu(2, memory_mib=1024),
                     gpu(3, healthy=False), gpu(4, numa=1, memory_mib=1024))
    assert inventory.twins == (0, 0, 2, 3, 2)


def test_planners_with_kept_free_shares_and_memos_answer_as_the_plain_scan() -> None:
    rng = random.Random(19)
    nodes = [random_node(rng, f"n{i}") for i in range(30)]
    ledger, live = Ledger(), []
    compared = fitted = 0
    for serial in range(120):
        request, policy = random_request(rng, nodes, serial), rng.choice(POLICIES)
        planner = PodPlanner(request, policy, CTX)
        for inventory in nodes + nodes[::-1]:  # every shape met again, its memos already filled
            usage = ledger.usage(inventory)
            fresh = plain_plan(inventory, usage, request, policy)
            assert planner.plan(inventory, usage) == fresh, (serial, policy, inventory.name)
            compared += 1
            fitted += not isinstance(fresh, FitFailure)
        target = rng.choice(nodes)  # loads change between questions, as binds and ends do
        record = allocate(target, ledger.usage(target), slice_pod(rng, serial), Policy())
        if not isinstance(record, FitFailure):
            ledger.apply(record, PodKey(f"ns/s{serial}"))
            live.append(PodKey(f"ns/s{serial}"))
        if live and rng.random() < 0.3:
            ledger.release(live.pop(rng.randrange(len(live))))
    assert compared == 120 * 60 and 0 < fitted < compared


def test_headroom_is_handed_only_to_policies_that_read_it() -> None:
    assert reads_headroom(Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE))
    assert reads_headroom(Policy(NodeScorer.BESTFIT, GpuPolicy.BINPACK))
    assert not reads_headroom(Policy()) and not reads_headroom(Policy(NodeScorer.SPREAD, GpuPolicy.SPREAD))


def test_a_planner_shared_by_nodes_of_one_shape_keeps_each_nodes_own_answer() -> None:
    a, b = (NodeInventory(n.name, n.gpus) for n in (node(gpu(0, node="a"), gpu(1, node="a"), name="a"),
                                                    node(gpu(0, node="b"), gpu(1, node="b"), name="b")))
    ledger = Ledger()
    request = PodRequest("ns", "p", (ContainerRequest("c", False, 1, memory_mib=40000),))
    policy = Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE)
    record = allocate(a, ledger.usage(a), request, policy, CTX)
    ledger.apply(record, PodKey("ns/first"))
    planner = PodPlanner(request, policy, CTX)
    assert planner.plan(a, ledger.usage(a)).containers[0][0].position == 1  # GPU 0 holds 40000 of 65536
    assert planner.plan(b, ledger.usage(b)).containers[0][0].position == 0
    ledger.apply(allocate(a, ledger.usage(a), request, policy, CTX), PodKey("ns/second"))
    assert planner.plan(a, ledger.usage(a)).summary() == ["2/2 CardInsufficientMemory"]
