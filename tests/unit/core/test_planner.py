"""PodPlanner: one pod planned over many nodes gives exactly plan_pod's answer on each node.

The planner works out what depends only on a node's shape once per shape; these tests
walk it over nodes that share shapes but differ in GPU ids, health, omitted-cores mode
and usage, with pods that filter by type and uuid, and compare every answer with a fresh
plan_pod. Also: shapes are interned (equal shapes are one key object) and a GPU spec's
derived numbers follow its fields.
"""

from __future__ import annotations

import dataclasses
import random

from rocshare.api.models import GpuPolicy, OmittedCores
from rocshare.core.allocate import PodPlanner, allocate, plan_pod
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory, ShapeKey
from rocshare.core.ledger import Ledger
from rocshare.core.policies import NodeScorer, Policy
from rocshare.core.request import ContainerRequest, PodRequest, Selection

from .helpers import gpu, node

KINDS = (
    dict(memory_mib=65536, cu_count=104, product="AMD Instinct MI210"),
    dict(memory_mib=196608, cu_count=304, product="AMD Instinct MI300X"),
    dict(memory_mib=24576, cu_count=96, product="AMD Radeon PRO W7900", gfx=110000, cu_per_wgp=2),
)


def random_node(rng: random.Random, name: str) -> NodeInventory:
    kind = rng.choice(KINDS)
    unhealthy = {rng.randrange(4)} if rng.random() < 0.2 else set()
    specs = [gpu(i, node=name, numa=i // 2, peers=tuple(p for p in range(4) if p != i), healthy=i not in unhealthy,
                 partition=rng.random() < 0.1, **kind) for i in range(4)]
    omitted = OmittedCores.SHARED if rng.random() < 0.3 else OmittedCores.EXCLUSIVE
    return node(*specs, name=name, omitted=omitted)


def random_request(rng: random.Random, nodes: list[NodeInventory], serial: int) -> PodRequest:
    containers = tuple(
        ContainerRequest(f"c{i}", False, rng.choice((1, 1, 2)),
                         memory_mib=rng.choice((None, 4096, 20000)), cores_pct=rng.choice((None, 10, 30, 60)))
        for i in range(rng.choice((1, 1, 2))))
    selection = Selection()
    draw = rng.random()
    if draw < 0.2:  # pinned to GPUs of one node: look-alike nodes must not share the answer
        target = rng.choice(nodes)
        selection = Selection(use_uuids=frozenset(g.gpu_id.lower() for g in target.gpus[:2]))
    elif draw < 0.3:
        selection = Selection(nouse_uuids=frozenset({rng.choice(nodes).gpus[0].gpu_id.lower()}))
    elif draw < 0.4:
        selection = Selection(use_types=("mi300x",))
    elif draw < 0.5:
        selection = Selection(numa_bind=True, link_bind=rng.random() < 0.5)
    return PodRequest("ns", f"p{serial}", containers, selection)


def fill(rng: random.Random, nodes: list[NodeInventory], ledger: Ledger) -> None:
    for serial in range(60):
        inventory = rng.choice(nodes)
        pod = PodRequest("ns", f"fill{serial}", (ContainerRequest("c", False, 1, memory_mib=rng.choice((None, 8192)),
                                                                  cores_pct=rng.choice((None, 25))),))
        record = allocate(inventory, ledger.usage(inventory), pod, Policy())
        if not isinstance(record, FitFailure):
            ledger.apply(record, PodKey(f"ns/fill{serial}"))


def test_one_planner_over_many_nodes_answers_as_plan_pod_on_each() -> None:
    rng = random.Random(11)
    nodes = [random_node(rng, f"n{i}") for i in range(40)]
    ledger = Ledger()
    fill(rng, nodes, ledger)
    policies = (Policy(), Policy(NodeScorer.SPREAD, GpuPolicy.SPREAD), Policy(gpu=GpuPolicy.TOPOLOGY_AWARE))
    compared = fitted = 0
    for serial in range(60):
        request, policy = random_request(rng, nodes, serial), rng.choice(policies)
        planner = PodPlanner(request, policy)
        for inventory in nodes + nodes[::-1]:  # every shape met again after others
            usage = ledger.usage(inventory)
            fresh = plan_pod(inventory, usage, request, policy)
            assert planner.plan(inventory, usage) == fresh, (serial, inventory.name)
            compared += 1
            fitted += not isinstance(fresh, FitFailure)
    assert compared == 60 * 80 and 0 < fitted < compared  # both answers were exercised


def test_a_uuid_filter_is_read_per_node_not_per_shape() -> None:
    a, b = node(gpu(0, node="a"), gpu(1, node="a"), name="a"), node(gpu(0, node="b"), gpu(1, node="b"), name="b")
    assert a.shape is b.shape
    pinned = PodRequest("ns", "p", (ContainerRequest("c", False, 1, memory_mib=1024),),
                        Selection(use_uuids=frozenset({a.gpus[1].gpu_id.lower()})))
    planner = PodPlanner(pinned, Policy())
    ledger = Ledger()
    assert planner.plan(a, ledger.usage(a)).containers[0][0].position == 1
    assert planner.plan(b, ledger.usage(b)).summary() == ["2/2 CardUuidMismatch"]


def test_equal_shapes_share_one_key_and_different_shapes_do_not() -> None:
    first = node(gpu(0, node="x"), gpu(1, node="x"), name="x")
    twin = node(gpu(0, node="y"), gpu(1, node="y"), name="y")
    sick = node(gpu(0, node="z"), gpu(1, node="z", healthy=False), name="z")
    shared = node(gpu(0, node="w"), gpu(1, node="w"), name="w", omitted=OmittedCores.SHARED)
    assert first.shape is twin.shape
    assert first.shape != sick.shape and first.shape != shared.shape
    assert ShapeKey(first.shape.key) == first.shape  # a key built apart is still equal, only slower


def test_a_gpu_specs_derived_numbers_follow_its_fields() -> None:
    rdna = gpu(0, gfx=110000, cu_per_wgp=2, cu_count=61)
    assert (rdna.cu_align, rdna.cu_usable, rdna.max_slices) == (2, 60, 10)
    cdna = dataclasses.replace(rdna, gfx_target_version=90010, partition=True)
    assert (cdna.cu_align, cdna.cu_usable, cdna.max_slices) == (1, 61, 1)
    assert cdna == dataclasses.replace(rdna, gfx_target_version=90010, partition=True)
