"""rocshare.core.holdings: what a pod holds (per GPU, in quota units, Kubernetes' GPU count),
and that a pod's cost before bind equals what its committed record holds after."""

from __future__ import annotations

import itertools

import pytest

from rocshare.api.allocation import AllocationRecord, encode_record
from rocshare.api.models import OmittedCores, Scheduling
from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.holdings import (Held, HostRequest, effective_gpus, host_request, placement_request, record_holding,
                                    request_cost, text_holding)
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import RequestError, parse_pod

from .helpers import gpu, node


def record(*containers: dict, node_name: str = "n1") -> AllocationRecord:
    return AllocationRecord.model_validate({"version": 1, "node": node_name, "containers": list(containers)})


def container(name: str, *devices: dict, init: bool = False, sidecar: bool = False) -> dict:
    return {"name": name, "init": init, "sidecar": sidecar, "devices": list(devices)}


def cu_slice(gpu_id: str, memory_mib: int, first: int, last: int, cores_pct: int | None = None) -> dict:
    body = {"gpuId": gpu_id, "memoryMiB": memory_mib, "cuCount": last - first + 1, "cuRanges": [[first, last]]}
    return body | ({"coresPct": cores_pct} if cores_pct is not None else {})


def shared(gpu_id: str, memory_mib: int, cu_count: int = 104) -> dict:
    return {"gpuId": gpu_id, "memoryMiB": memory_mib, "cuCount": cu_count}


def exclusive(gpu_id: str, memory_mib: int, cu_count: int = 104) -> dict:
    return {"gpuId": gpu_id, "memoryMiB": memory_mib, "cuCount": cu_count, "reservesAllCores": True}


def whole(gpu_id: str, memory_mib: int = 65536, cu_count: int = 104) -> dict:
    return {"gpuId": gpu_id, "memoryMiB": memory_mib, "cuCount": cu_count, "whole": True}


CU_COUNTS = {"g1": 104, "g2": 104}


@pytest.mark.parametrize(("containers", "held"), [
    ([container("a", cu_slice("g1", 4096, 0, 31, cores_pct=30))], Held(4096, 30, 1)),
    # Records older than coresPct: the CUs over the GPU's CUs, rounded up.
    ([container("a", cu_slice("g1", 4096, 0, 26))], Held(4096, 26, 1)),
    ([container("a", shared("g1", 4096))], Held(4096, 0, 1)),  # Shared, no gpucores: reserves no CU
    ([container("a", exclusive("g1", 4096))], Held(4096, 100, 1)),  # Exclusive, no gpucores: every CU
    ([container("a", whole("g1"))], Held(65536, 100, 1)),  # a whole GPU or a partition
    # A plain init container runs before the app: over the app's slice on the same GPU the pod holds
    # max(init, app) -- 8000 MiB, 10 % (the CUs: the union of both, 0-19) -- and the GPU count is
    # Kubernetes': max(init, app) = 1...
    ([container("i", cu_slice("g1", 8000, 0, 9, 10), init=True), container("a", cu_slice("g1", 2000, 10, 19, 10))],
     Held(8000, 10, 1)),
    # ...a larger init grows it: max(2000, 3000) MiB, max(10, 40) %...
    ([container("i", cu_slice("g1", 3000, 0, 41, 40), init=True), container("a", cu_slice("g1", 2000, 0, 9, 10))],
     Held(3000, 40, 1)),
    # ...but an init slice on another GPU than its slot's is summed (never under-count).
    ([container("i", cu_slice("g2", 8000, 0, 9, 10), init=True), container("a", cu_slice("g1", 2000, 10, 19, 10))],
     Held(10000, 20, 1)),
    # A sidecar declared before the init runs beside it: the init lies over the app's slice, not the sidecar's.
    ([container("s", cu_slice("g1", 1000, 0, 9, 10), init=True, sidecar=True),
      container("i", cu_slice("g1", 5000, 20, 49, 30), init=True), container("a", cu_slice("g1", 2000, 20, 29, 10))],
     Held(1000 + 5000, 10 + 30, 2)),
    # A native sidecar runs beside the app containers: its GPU counts with theirs.
    ([container("s", cu_slice("g1", 1000, 0, 9, 10), init=True, sidecar=True),
      container("a", cu_slice("g2", 1000, 0, 9, 10))], Held(2000, 20, 2)),
])
def test_what_a_record_holds(containers, held) -> None:
    assert record_holding(record(*containers)).held(CU_COUNTS) == held


def test_a_gpu_unknown_to_the_reader_counts_whole_cores_for_an_old_record() -> None:
    assert record_holding(record(container("a", cu_slice("g9", 1, 0, 3)))).held({}).cores_pct == 100


@pytest.mark.parametrize(("containers", "count"), [
    ([], 0),
    ([(False, False, 2), (False, False, 1)], 3),  # app containers add up
    ([(True, False, 4), (False, False, 1)], 4),  # an init container runs alone: the larger
    ([(True, True, 1), (True, False, 2), (False, False, 1)], 3),  # sidecar 1 beside init 2; then 1 + app 1
    ([(True, False, 1), (True, True, 2), (False, False, 2)], 4),  # a sidecar started after the init: app + 2
])
def test_effective_gpu_count_is_kubernetes_rule(containers, count) -> None:
    assert effective_gpus(containers) == count


@pytest.mark.parametrize("text", ["{not json", '{"version": 2}', '{"version": 1, "node": "n1", "containers": "x"}',
                                  '{"version": 1, "node": "n1", "containers": [{"name": "a", "devices": [{}]}]}'])
def test_a_record_that_cannot_be_read_holds_unknown_gpus_on_its_node(text) -> None:
    holding = text_holding(text, "n1")
    assert not holding.accountable and holding.node == "n1" and holding.problem
    assert holding.gpus == ()


def test_a_record_naming_another_node_is_not_trusted() -> None:
    text = encode_record(record(container("a", whole("g1")), node_name="n2"))
    holding = text_holding(text, "n1")
    assert not holding.accountable and "n2" in holding.problem and holding.node == "n1"
    assert text_holding(text, "").accountable  # unbound (a record written before bindings carried it)


def test_the_ledger_reserves_what_the_holding_says() -> None:
    ledger = Ledger()
    held = record(container("i", cu_slice("g1", 8000, 0, 9, 10), init=True), container("a", shared("g1", 2000)),
                  container("b", exclusive("g2", 100)))
    ledger.apply(held, "ns/p")
    g1, g2 = ledger.gpu_usage("n1", "g1"), ledger.gpu_usage("n1", "g2")
    # The init slice lies over the Shared app slice on g1 (which reserves no CU): max(8000, 2000) MiB,
    # one slice, the init's 10 CUs.
    assert (g1.memory_mib, g1.slices, g1.cu_held, g1.whole) == (8000, 1, 10, 0)
    assert (g2.memory_mib, g2.slices, g2.cu_held) == (100, 1, 104)
    ledger.release("ns/p")
    assert ledger.is_empty


CONTAINER_SHAPES = [
    {"amd.com/gpumem": 3000},
    {"amd.com/gpumem": 8000, "amd.com/gpucores": 30},
    {"amd.com/gpumem-percentage": 25, "amd.com/gpucores": 15},
    {"amd.com/gpu": 1},
    {"amd.com/gpu": 2, "amd.com/gpumem": 1000, "amd.com/gpucores": 10},
]


def _pod(app: dict, init: dict | None, sidecar: dict | None) -> dict:
    def one(name: str, limits: dict, **extra) -> dict:
        return {"name": name, "resources": {"limits": {k: str(v) for k, v in limits.items()}}, **extra}
    inits = ([one("side", sidecar, restartPolicy="Always")] if sidecar else []) + ([one("init", init)] if init else [])
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"initContainers": inits, "containers": [one("app", app)]}}


@pytest.mark.parametrize("omitted", [OmittedCores.EXCLUSIVE, OmittedCores.SHARED])
@pytest.mark.parametrize("partitions", [False, True])
def test_cost_before_bind_equals_the_hold_after(omitted, partitions) -> None:
    """What quota charges a pod (before bind) is what status and the ledger count of its record (after)."""
    inventory = node(*(gpu(i, memory_mib=65536, cu_count=104, partition=partitions) for i in range(4)),
                     omitted=omitted)
    cu_counts = {spec.gpu_id: spec.cu_count for spec in inventory.gpus}
    checked = 0
    for app, init, side in itertools.product(CONTAINER_SHAPES, [None, *CONTAINER_SHAPES[:2]], [None, CONTAINER_SHAPES[0]]):
        request = parse_pod(_pod(app, init, side))
        decision = allocate(inventory, Ledger().usage(inventory), request, Policy.resolve(Scheduling(), request))
        if isinstance(decision, FitFailure):
            continue
        cost = request_cost(request, gpu_memory_mib=65536, omitted=omitted, whole_devices=partitions)
        assert record_holding(decision).held(cu_counts) == cost, (app, init, side)
        checked += 1
    assert checked >= 20


# ---- host resources: what a pod holds of its node's CPU and memory ----------------------------------


def _container(name: str, *, requests: dict | None = None, limits: dict | None = None, always: bool = False) -> dict:
    container = {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}}
    if always:
        container["restartPolicy"] = "Always"
    return container


@pytest.mark.parametrize(("spec", "cpu_milli", "memory_mib"), [
    ({"containers": [_container("a", requests={"cpu": "1", "memory": "1Gi"}),
                     _container("b", requests={"cpu": "500m", "memory": "512Mi"})]}, 1500, 1536),
    # A limit alone stands for the request (the API server defaults one to the other).
    ({"containers": [_container("a", limits={"cpu": "2", "memory": "2Gi"})]}, 2000, 2048),
    # An init container larger than the app containers sets the figure; sidecars run beside both.
    ({"initContainers": [_container("side", requests={"cpu": "1"}, always=True), _container("init", requests={"cpu": "4"})],
      "containers": [_container("a", requests={"cpu": "1"})]}, 5000, 0),
    ({"initContainers": [_container("init", requests={"cpu": "1"})],
      "containers": [_container("a", requests={"cpu": "3"})], "overhead": {"cpu": "250m", "memory": "64Mi"}}, 3250, 64),
    ({"containers": [_container("a")]}, 0, 0),
])
def test_host_request_is_kubernetes_rule(spec, cpu_milli, memory_mib) -> None:
    assert host_request(spec) == HostRequest(cpu_milli, memory_mib)


def test_an_unreadable_host_request_is_refused_naming_the_container() -> None:
    with pytest.raises(RequestError, match="container 'a': cpu is in cores: 'lots'"):
        host_request({"containers": [_container("a", requests={"cpu": "lots"})]})


def test_placement_request_carries_the_pods_cpu_and_memory() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"containers": [_container("a", requests={"cpu": "3", "memory": "1Gi"}, limits={"amd.com/gpu": "1"})]}}
    request = placement_request(pod)
    assert (request.cpu_milli, request.memory_mib, request.wants_gpus) == (3000, 1024, True)
