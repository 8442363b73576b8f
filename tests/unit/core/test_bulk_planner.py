"""The bulk planner (rocshare.core.bulk) answers exactly as the scalar `PodPlanner.plan`, node by node.

Random fleets (8-GPU MI210-like nodes with two XGMI hives, MI300X, partitioned nodes offered under
partition names, unhealthy GPUs, an RDNA GPU with 2 CUs per WGP and an odd CU count, nodes of 1 to
8 GPUs, host CPU and memory tracked or not, omitted cores shared or exclusive) are filled through
the ledger with random records and host holds; random requests (1-4 GPUs, MiB, percent, cores,
whole GPUs, partition kinds, type filters, NUMA/link binding for one GPU) are planned for every
node by both planners under every node scorer x GPU policy, with no fragmentation model and with
models whose tasks ask CPU, name products or ask no GPU. Scores must be the same float bit for
bit (`float.hex`) and failures the same `FitFailure` (reasons and counts). The loads then change
(binds and releases) and the same `FleetArrays` is asked again: its rows must follow the journal
and replaced inventories. Two deliberately broken variants (tasks summed in another order, ties
to the highest position) must be caught by the same comparison, which shows it can see them.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.api.models import GpuPolicy, OmittedCores
from rocshare.core import bulk_scoring
from rocshare.core.allocate import PodPlanner, allocate
from rocshare.core.bulk import BulkPlanner, handles
from rocshare.core.fit import FitFailure
from rocshare.core.fleet import FleetArrays
from rocshare.core.fragmentation import FragmentationModel, TypicalTask, TypicalWorkload
from rocshare.core.ids import NodeName, PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import NodeScorer, Policy, ScoringContext
from rocshare.core.request import ContainerRequest, PodRequest, Selection

from .helpers import gpu

MI210 = dict(memory_mib=65536, cu_count=104, product="AMD Instinct MI210")
MI300X = dict(memory_mib=196608, cu_count=304, product="AMD Instinct MI300X")
W7900 = dict(memory_mib=49152, cu_count=95, product="AMD Radeon PRO W7900", gfx=110000, cu_per_wgp=2)
POLICIES = tuple(Policy(node, gpu_policy) for node in NodeScorer for gpu_policy in GpuPolicy)
MODELS = (
    None,
    FragmentationModel(TypicalWorkload((TypicalTask(0, 1, 250, weight=0.5), TypicalTask(0, 1, 500, weight=0.3),
                                        TypicalTask(0, 2, 1000, weight=0.2)))),
    FragmentationModel(TypicalWorkload((  # CPU asks, product filters, a CPU-only task, weights that round
        TypicalTask(2000, 1, 160, weight=0.31), TypicalTask(16000, 1, 1000, weight=0.17),
        TypicalTask(4000, 2, 300, ("mi300x",), weight=0.13), TypicalTask(1000, 0, 0, weight=0.07),
        TypicalTask(8000, 4, 1000, weight=0.11), TypicalTask(500, 1, 50, ("radeon", "mi210"), weight=0.21)))),
)


# ---- fleets -------------------------------------------------------------------------------------


def random_node(rng: random.Random, name: str) -> NodeInventory:
    kind = rng.choice(("mi210", "mi300x", "partitions", "rdna", "small"))
    count = {"mi210": 8, "mi300x": 8, "partitions": rng.choice((4, 8)), "rdna": 2, "small": rng.choice((1, 2, 4))}[kind]
    specs = []
    for i in range(count):
        if kind == "mi210":
            hive = range(4 * (i // 4), 4 * (i // 4) + 4)
            spec = gpu(i, node=name, numa=i // 4, peers=tuple(p for p in hive if p != i), **MI210)
        elif kind == "mi300x":
            spec = gpu(i, node=name, numa=i // 4, peers=tuple(p for p in range(count) if p != i), **MI300X)
        elif kind == "partitions":
            part = gpu(i, node=name, numa=0, memory_mib=24576, cu_count=38, product="AMD Instinct MI300X",
                       partition=True)
            spec = dataclasses.replace(part, resource=rng.choice(("amd.com/gpu", "amd.com/cpx_nps4")))
        elif kind == "rdna":
            spec = gpu(i, node=name, numa=None, **(W7900 if i == 0 else MI210))
        else:
            spec = gpu(i, node=name, numa=0, **rng.choice((MI210, MI300X, W7900)),
                       split_count=rng.choice((2, 10)))
        if rng.random() < 0.08:
            spec = dataclasses.replace(spec, healthy=False)
        specs.append(spec)
    tracked = rng.random() < 0.6
    return NodeInventory(NodeName(name), tuple(specs),
                         omitted_cores=rng.choice((OmittedCores.EXCLUSIVE, OmittedCores.SHARED)),
                         cpu_milli=rng.choice((16000, 64000, 128000)) if tracked else 0,
                         memory_mib=rng.choice((65536, 262144)) if tracked and rng.random() < 0.7 else 0)


def random_request(rng: random.Random, serial: int, *, bulk_only: bool = True) -> PodRequest:
    gpus = rng.choice((1, 1, 1, 2, 2, 3, 4))
    memory_mib = memory_pct = cores_pct = None
    form = rng.random()
    if form < 0.2:
        pass  # whole GPUs
    elif form < 0.5:
        memory_mib, cores_pct = rng.choice((2048, 8192, 16384, 40000, 70000)), rng.choice((None, 5, 25, 33, 50, 100))
    elif form < 0.7:
        memory_pct, cores_pct = rng.choice((10, 25, 50, 100)), rng.choice((None, 10, 50))
    else:
        cores_pct = rng.choice((1, 10, 30, 75))
    resource = "amd.com/cpx_nps4" if rng.random() < 0.08 else "amd.com/gpu"
    if resource != "amd.com/gpu":
        memory_mib = memory_pct = cores_pct = None
    container = ContainerRequest("main", False, gpus, memory_mib, memory_pct, cores_pct, resource=resource)
    draw = rng.random()
    selection = Selection()
    if draw < 0.15:
        selection = Selection(use_types=("mi300x",))
    elif draw < 0.25:
        selection = Selection(nouse_types=("radeon",))
    elif draw < 0.35 and (gpus == 1 or not bulk_only):
        selection = Selection(numa_bind=True, link_bind=rng.random() < 0.5)
    return PodRequest("ns", f"p{serial}", (container,), selection, cpu_milli=rng.choice((0, 1000, 8000, 40000)),
                      memory_mib=rng.choice((0, 4096, 100000)))


def fill(rng: random.Random, nodes: list[NodeInventory], ledger: Ledger, pods: int, serial: int = 0) -> list[PodKey]:
    """Random records (the scalar allocator's) and host holds on random nodes."""
    live = []
    for i in range(pods):
        node = rng.choice(nodes)
        key = PodKey(f"ns/fill-{serial}-{i}")
        if rng.random() < 0.1:
            ledger.add_host(node.name, key, cpu_milli=rng.choice((1000, 8000)), memory_mib=rng.choice((1024, 30000)))
            live.append(key)
            continue
        request = dataclasses.replace(random_request(rng, i), selection=Selection(), cpu_milli=0, memory_mib=0)
        record = allocate(node, ledger.usage(node), request, Policy())
        if not isinstance(record, FitFailure):
            ledger.apply(record, key, cpu_milli=rng.choice((0, 2000, 12000)), memory_mib=rng.choice((0, 8192)))
            live.append(key)
    return live


# ---- the comparison -----------------------------------------------------------------------------


def scalar_answers(nodes: list[NodeInventory], ledger: Ledger, planner: PodPlanner) -> dict[str, object]:
    """Node -> (score, chosen GPU positions) or the FitFailure."""
    answers: dict[str, object] = {}
    for node in nodes:
        plan = planner.plan(node, ledger.usage(node))
        answers[node.name] = plan if isinstance(plan, FitFailure) else (
            plan.score, tuple(device.position for device in plan.containers[0]))
    return answers


def bulk_answers(nodes: list[NodeInventory], ledger: Ledger, planner: PodPlanner, fleet: FleetArrays) -> dict:
    inventories = {node.name: node for node in nodes}
    found = BulkPlanner(planner).plan(fleet, [n.name for n in nodes], nodes, ledger, inventories, positions=True)
    answers: dict[str, object] = dict(zip(found.fit_names, zip(found.scores, found.positions)))
    answers.update(zip(found.misfit_names, (found.failures[i] for i in found.failure_ids)))
    return answers


def mismatches(nodes, ledger, request, policy, ctx, fleet) -> list[tuple]:
    planner = PodPlanner(request, policy, ctx)
    expected = scalar_answers(nodes, ledger, planner)
    got = bulk_answers(nodes, ledger, PodPlanner(request, policy, ctx), fleet)
    assert got.keys() == expected.keys()
    wrong = []
    for name, want in expected.items():
        have = got[name]
        if isinstance(want, tuple):
            if not isinstance(have, tuple) or type(have[0]) is not float or have[0].hex() != want[0].hex() \
                    or have[1] != want[1]:
                wrong.append((name, want, have))
        elif have != want:
            wrong.append((name, want, have))
    return wrong


def compare_fleet(seed: int, *, rounds: int = 3, nodes_count: int = 40, requests: int = 12) -> tuple[int, int]:
    """Every policy and model over one evolving random fleet; returns (answers compared, fits)."""
    rng = random.Random(seed)
    nodes = [random_node(rng, f"n{i:03d}") for i in range(nodes_count)]
    ledger, fleet = Ledger(), FleetArrays()
    live = fill(rng, nodes, ledger, nodes_count * 4)
    compared = fitted = 0
    for round_ in range(rounds):
        for serial in range(requests):
            request = random_request(rng, serial)
            policy, model = rng.choice(POLICIES), rng.choice(MODELS)
            ctx = ScoringContext(model, cpu_norm_milli=rng.choice((128_000, 64_000)),
                                 gpu_norm_milli=rng.choice((8000, 4000)))
            if not handles(request, policy):
                continue
            wrong = mismatches(nodes, ledger, request, policy, ctx, fleet)
            assert not wrong, (seed, round_, request, policy, model and model.workload, wrong[:3])
            compared += len(nodes)
            answers = scalar_answers(nodes, ledger, PodPlanner(request, policy, ctx)).values()
            fitted += sum(not isinstance(answer, FitFailure) for answer in answers)
        for key in rng.sample(live, k=min(len(live), nodes_count // 2)):  # loads change between rounds
            ledger.release(key)
            live.remove(key)
        live += fill(rng, nodes, ledger, nodes_count, serial=round_ + 1)
        for i in rng.sample(range(len(nodes)), k=3):  # and some inventories are replaced
            nodes[i] = random_node(rng, nodes[i].name)
    return compared, fitted


def test_bulk_answers_equal_the_scalar_planners_on_random_fleets() -> None:
    compared = fitted = 0
    for seed in range(6):
        more, fits = compare_fleet(seed)
        compared, fitted = compared + more, fitted + fits
    assert compared > 2000 and 0.1 * compared < fitted < 0.9 * compared  # both kinds of answer exercised


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_bulk_answers_equal_the_scalar_planners_property(seed: int) -> None:
    compare_fleet(seed, rounds=2, nodes_count=16, requests=8)


def test_every_policy_and_model_is_compared_on_one_fleet() -> None:
    """The table: each node scorer x GPU policy x model, one request form each, all answers equal."""
    rng = random.Random(99)
    nodes = [random_node(rng, f"t{i:02d}") for i in range(60)]
    ledger = Ledger()
    fill(rng, nodes, ledger, 240)
    requests = [
        PodRequest("ns", "one", (ContainerRequest("c", False, 1, memory_mib=8192, cores_pct=25),), cpu_milli=2000),
        PodRequest("ns", "two", (ContainerRequest("c", False, 2, memory_pct=50),), cpu_milli=8000, memory_mib=4096),
        PodRequest("ns", "whole", (ContainerRequest("c", False, 4),)),
        PodRequest("ns", "cores", (ContainerRequest("c", False, 1, cores_pct=33),), Selection(use_types=("mi210",))),
    ]
    fleet = FleetArrays()
    for policy in POLICIES:
        for model in MODELS:
            for request in requests:
                if handles(request, policy):
                    wrong = mismatches(nodes, ledger, request, policy, ScoringContext(model), fleet)
                    assert not wrong, (policy, request)


def test_a_gpu_overfilled_by_conflicting_records_is_answered_exactly_too() -> None:
    """Free shares far below zero (records that conflict, which the allocator never writes) take the
    planner's int64 path; the answers still equal the scalar planner's."""
    rng = random.Random(31)
    nodes = [random_node(rng, f"o{i:02d}") for i in range(20)]
    ledger = Ledger()
    fill(rng, nodes, ledger, 60)
    for i, node in enumerate(nodes[:5]):
        device = DeviceSlice(gpu_id=node.gpus[0].gpu_id, memory_mib=10**12, cu_ranges=[], cu_count=1)
        record = AllocationRecord(node=node.name, containers=[ContainerAllocation(name="c", devices=[device])])
        ledger.apply(record, PodKey(f"ns/conflict-{i}"))
    assert min(min(ledger.usage(node).free_milli) for node in nodes[:5]) < -10**6
    request = PodRequest("ns", "p", (ContainerRequest("c", False, 1, memory_mib=1024, cores_pct=10),), cpu_milli=1000)
    for policy in (Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE),
                   Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE), Policy(NodeScorer.BESTFIT)):
        for model in MODELS:
            assert not mismatches(nodes, ledger, request, policy, ScoringContext(model), FleetArrays())


def test_requests_outside_the_bulk_forms_are_left_to_the_scalar_planner() -> None:
    one = ContainerRequest("c", False, 1, memory_mib=1024)
    two = ContainerRequest("c", False, 2, memory_mib=1024)
    assert handles(PodRequest("ns", "p", (one,)), Policy())
    assert handles(PodRequest("ns", "p", (one,), Selection(numa_bind=True, link_bind=True)), Policy())
    assert handles(PodRequest("ns", "p", (two,)), Policy(NodeScorer.FGD, GpuPolicy.FRAGMENTATION_AWARE))
    assert not handles(PodRequest("ns", "p", (two,), Selection(numa_bind=True)), Policy())
    assert not handles(PodRequest("ns", "p", (two,), Selection(link_bind=True)), Policy())
    assert not handles(PodRequest("ns", "p", (two,)), Policy(gpu=GpuPolicy.TOPOLOGY_AWARE))
    assert handles(PodRequest("ns", "p", (one,)), Policy(gpu=GpuPolicy.TOPOLOGY_AWARE))
    assert not handles(PodRequest("ns", "p", (one, one)), Policy())
    assert not handles(PodRequest("ns", "p", (one,), Selection(use_uuids=frozenset({"gpu-x"}))), Policy())
    assert not handles(PodRequest("ns", "p", (ContainerRequest("c", False, 0),)), Policy())


def test_the_fleet_rows_follow_the_ledger_and_replaced_inventories() -> None:
    rng = random.Random(5)
    nodes = [random_node(rng, f"r{i}") for i in range(30)]
    ledger, fleet = Ledger(), FleetArrays()
    live = fill(rng, nodes, ledger, 90)
    inventories = {node.name: node for node in nodes}

    def assert_rows_hold_the_ledgers_usage() -> None:
        for batch in fleet.locate([n.name for n in nodes], nodes, ledger, inventories):
            block = batch.block
            for column, position in zip(batch.columns.tolist(), batch.positions.tolist()):
                usage = ledger.usage(nodes[position])
                assert block.loads[:, :, column].T.tolist() == [list(load) for load in usage.loads]
                assert block.host[:, column].tolist() == [usage.cpu_milli, usage.memory_mib]
                assert tuple(block.free[:, column].tolist()) == usage.free_milli
                assert block.shapes.nodes[block.shape[column]].shape is nodes[position].shape

    assert_rows_hold_the_ledgers_usage()
    for step in range(10):
        ledger.release(live.pop(rng.randrange(len(live))))
        live += fill(rng, nodes, ledger, 5, serial=step + 1)
        i = rng.randrange(len(nodes))
        nodes[i] = inventories[nodes[i].name] = random_node(rng, nodes[i].name)
        assert_rows_hold_the_ledgers_usage()
    other = Ledger()  # another ledger: everything is read again
    fill(rng, nodes, other, 20)
    ledger = other
    assert_rows_hold_the_ledgers_usage()


def test_one_bulk_planner_asked_again_after_the_fleet_started_over_answers_afresh() -> None:
    """A planner keeps per-shape needs between calls; a fleet that starts over (another ledger, a
    dropped journal) numbers its shapes anew, and the planner must not read the old numbering."""
    rng = random.Random(41)
    first = [random_node(rng, f"a{i:02d}") for i in range(30)]
    second = [random_node(rng, f"a{i:02d}") for i in range(30)]  # the same names, other shapes
    request = PodRequest("ns", "p", (ContainerRequest("c", False, 1, memory_mib=4096, cores_pct=25),))
    policy, ctx = Policy(NodeScorer.FRAGMENTATION, GpuPolicy.FRAGMENTATION_AWARE), ScoringContext(MODELS[2])
    fleet, planner = FleetArrays(), BulkPlanner(PodPlanner(request, policy, ctx))
    for nodes in (first, second):
        ledger = Ledger()
        fill(rng, nodes, ledger, 80)
        found = planner.plan(fleet, [n.name for n in nodes], nodes, ledger, {n.name: n for n in nodes})
        answers = dict(zip(found.fit_names, found.scores))
        answers.update(zip(found.misfit_names, (found.failures[i] for i in found.failure_ids)))
        for node in nodes:
            plan = PodPlanner(request, policy, ctx).plan(node, ledger.usage(node))
            assert answers[node.name] == (plan if isinstance(plan, FitFailure) else plan.score), node.name


# ---- the comparison sees what a careless vectorisation gets wrong -------------------------------


def _reversed_weighting(self, fragment, total):
    """TaskArrays._weighted, the tasks summed last to first."""
    expected = np.zeros(fragment.shape[1:])
    for task in reversed(range(len(self.weights))):
        expected = expected + self.weights[task] * fragment[task]
    return np.where(total == 0, 0.0, expected)


def _last_maximum(scores, count):
    """_choose with ties to the highest position."""
    chosen, every, scores = np.zeros(scores.shape, bool), np.arange(scores.shape[1]), scores.copy()
    first = None
    for _ in range(count):
        best = len(scores) - 1 - np.argmax(scores[::-1], axis=0)
        first = best if first is None else first
        chosen[best, every] = True
        scores[best, every] = -np.inf
    return chosen, first


def measure_mismatches(nodes: list[NodeInventory], ledger: Ledger, model: FragmentationModel) -> list[tuple]:
    """The measure's arrays against the model's own numbers, node by node: free shares, the node's
    expected fragmentation before, and after each GPU alone takes a slice (CPU after a 2-core pod)."""
    fleet, inventories = FleetArrays(), {node.name: node for node in nodes}
    batches = fleet.locate([n.name for n in nodes], nodes, ledger, inventories)
    tasks = bulk_scoring.TaskArrays(model, list(fleet.products))
    slice_load = np.array([4096, 1, 8, 0])[:, None, None]
    wrong = []
    for batch in batches:
        block, picked = batch.block, [nodes[i] for i in batch.positions.tolist()]
        shape = block.shape[batch.columns]
        gpus = bulk_scoring.GpuArrays.of(block.shapes.build(), shape)
        loads = block.loads[:, :, batch.columns]
        free = bulk_scoring.free_shares(loads, gpus).astype(np.int32)
        free_after = bulk_scoring.free_shares(loads + slice_load, gpus).astype(np.int32)
        node_cpu = block.shapes.node_cpu_milli[shape]
        tracked, cpu_before = node_cpu != 0, node_cpu - block.host[0, batch.columns]
        access = tasks.access_of(gpus.product)
        before, parts = tasks.expected(free, access, tasks.cpu_below(cpu_before, tracked))
        each = tasks.expected_each(free, free_after, access, tasks.cpu_below(cpu_before - 2000, tracked), parts)
        for column, node in enumerate(picked):
            usage = ledger.usage(node)
            cpu = int(cpu_before[column]) if node.cpu_milli else None
            if tuple(free[:, column].tolist()) != usage.free_milli:
                wrong.append((node.name, "free", usage.free_milli, free[:, column]))
            want = model.node_fragmentation(node, usage.loads, cpu)
            if want.hex() != float(before[column]).hex():
                wrong.append((node.name, "before", want, before[column]))
            for pos, load in enumerate(usage.loads):
                after = list(usage.loads)
                after[pos] = tuple(a + b for a, b in zip(load, (4096, 1, 8, 0)))
                want = model.node_fragmentation(node, tuple(after), None if cpu is None else cpu - 2000)
                if want.hex() != float(each[pos, column]).hex():
                    wrong.append((node.name, pos, want, each[pos, column]))
    return wrong


def test_the_measure_on_arrays_equals_the_models_bit_for_bit() -> None:
    rng = random.Random(23)
    nodes = [random_node(rng, f"m{i:02d}") for i in range(80)]
    ledger = Ledger()
    fill(rng, nodes, ledger, 320)
    for model in MODELS[1:]:
        assert not measure_mismatches(nodes, ledger, FragmentationModel(model.workload))


def test_a_measure_summed_in_another_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_scoring.TaskArrays, "_weighted", _reversed_weighting)
    rng = random.Random(23)
    nodes = [random_node(rng, f"m{i:02d}") for i in range(80)]
    ledger = Ledger()
    fill(rng, nodes, ledger, 320)
    assert measure_mismatches(nodes, ledger, FragmentationModel(MODELS[2].workload))


def test_ties_broken_the_other_way_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rocshare.core.bulk._choose", _last_maximum)
    rng = random.Random(17)
    nodes = [random_node(rng, f"b{i:02d}") for i in range(60)]
    ledger = Ledger()
    fill(rng, nodes, ledger, 200)
    request = PodRequest("ns", "p", (ContainerRequest("c", False, 1, memory_mib=8192, cores_pct=10),), cpu_milli=2000)
    assert mismatches(nodes, ledger, request, Policy(), ScoringContext(), FleetArrays())
