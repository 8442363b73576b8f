"""Property tests over random clusters and request streams (hypothesis).

Proves, after every placement and release: no GPU holds more than its registered memory,
its CUs or its split count; pinned CU ranges of co-tenants never overlap (and never overlap
a whole-GPU or reserve-all tenant); and releasing every pod returns the ledger to empty.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocshare.api.models import GpuPolicy, OmittedCores
from rocshare.core.allocate import allocate
from rocshare.core.cumask import mask_from_ranges
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import NodeScorer, Policy
from rocshare.core.request import ContainerRequest, PodRequest

from .helpers import gpu, node

gpus_strategy = st.lists(
    st.tuples(
        st.sampled_from([(90010, 1, 104), (90402, 1, 304), (110000, 2, 96), (120001, 2, 64)]),
        st.integers(1000, 64000),
        st.integers(1, 4),
        st.booleans(),
    ),
    min_size=1, max_size=4,
)

container_strategy = st.builds(
    lambda gpus, mem, pct, cores, init: ContainerRequest("c", init, gpus, mem, None if mem else pct, cores),
    st.integers(1, 3),
    st.one_of(st.none(), st.integers(1, 40000)),
    st.one_of(st.none(), st.integers(1, 100)),
    st.one_of(st.none(), st.integers(1, 100)),
    st.booleans(),
)

operation_strategy = st.one_of(
    st.tuples(st.just("place"), st.lists(container_strategy, min_size=1, max_size=2)),
    st.tuples(st.just("release"), st.integers(0, 50)),
)


def build_node(raw, omitted) -> NodeInventory:
    specs = [gpu(i, gfx=gfx, cu_per_wgp=wgp, cu_count=cus, memory_mib=mem, split_count=split, partition=part)
             for i, ((gfx, wgp, cus), mem, split, part) in enumerate(raw)]
    return node(*specs, omitted=omitted)


def check_invariants(inventory: NodeInventory, ledger: Ledger) -> None:
    for spec in inventory.gpus:
        usage = ledger.gpu_usage(inventory.name, spec.gpu_id)
        assert usage.memory_mib <= spec.memory_mib
        assert usage.slices <= spec.max_slices
        assert usage.cu_held <= spec.cu_count
        assert usage.whole <= 1 and (not usage.whole or usage.slices == 1)
    held: dict[str, int] = {}
    for record in ledger.records().values():
        pod: dict[str, int] = {}
        for container in record.containers:
            if container.init and not container.sidecar:
                continue  # runs before the app containers: its ranges lie over the pod's (checked below)
            for device in container.devices:
                mask = device_mask(device)
                assert pod.get(device.gpu_id, 0) & mask == 0, "CU ranges of containers running together overlap"
                pod[device.gpu_id] = pod.get(device.gpu_id, 0) | mask
        for container in record.containers:
            for device in container.devices:
                pod[device.gpu_id] = pod.get(device.gpu_id, 0) | device_mask(device)
        for gpu_id, mask in pod.items():
            assert held.get(gpu_id, 0) & mask == 0, "co-tenant CU ranges overlap"
            held[gpu_id] = held.get(gpu_id, 0) | mask


def device_mask(device) -> int:
    if device.whole or device.reserves_all_cores:
        return (1 << device.cu_count) - 1
    return mask_from_ranges(device.cu_ranges)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=gpus_strategy,
    omitted=st.sampled_from(list(OmittedCores)),
    policy=st.sampled_from([Policy(NodeScorer.BINPACK, g) for g in GpuPolicy]),
    operations=st.lists(operation_strategy, max_size=25),
)
def test_random_streams_keep_every_gpu_within_limits(raw, omitted, policy, operations):
    inventory = build_node(raw, omitted)
    ledger = Ledger()
    placed: list[PodKey] = []
    for serial, (kind, payload) in enumerate(operations):
        if kind == "place":
            request = PodRequest("ns", f"p{serial}", tuple(payload))
            result = allocate(inventory, ledger.usage(inventory), request, policy)
            if not isinstance(result, FitFailure):
                key = PodKey(f"ns/p{serial}")
                ledger.apply(result, key)
                placed.append(key)
        elif placed:
            ledger.release(placed.pop(payload % len(placed)))
        check_invariants(inventory, ledger)
    rebuilt = Ledger.from_records(ledger.records().items())
    assert [rebuilt.gpu_usage(inventory.name, g.gpu_id) for g in inventory.gpus] == [ledger.gpu_usage(inventory.name, g.gpu_id) for g in inventory.gpus]
    for key in placed:
        ledger.release(key)
    assert ledger.is_empty
    assert ledger.usage(inventory).empty


@settings(max_examples=40, deadline=None)
@given(raw=gpus_strategy, containers=st.lists(container_strategy, min_size=1, max_size=2))
def test_a_fitting_pod_always_gets_a_record_matching_its_request(raw, containers):
    inventory = build_node(raw, OmittedCores.EXCLUSIVE)
    request = PodRequest("ns", "p", tuple(containers))
    result = allocate(inventory, Ledger().usage(inventory), request, Policy())
    if isinstance(result, FitFailure):
        assert result.reasons and all(count <= result.total for _, count in result.reasons)
        return
    assert [c.init for c in result.containers] == [c.init for c in request.containers]
    for container, allocation in zip(request.containers, result.containers):
        assert len(allocation.devices) == container.gpus
        assert len({d.gpu_id for d in allocation.devices}) == container.gpus
        for device in allocation.devices:
            assert sum(high - low + 1 for low, high in device.cu_ranges) in (0, device.cu_count)
