"""rocshare.core.resize: a running pod's slice grown and shrunk on its own GPUs, or refused with a
reason (memory, CUs beside the neighbours', quota), and the resize request's codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice, decode_record, encode_record
from rocshare.api.models import CuLayout, ShareLimits
from rocshare.api.resize import ResizeError, ResizeRequest, decode_request, encode_request, request_generation
from rocshare.core.cu_topology import CuTopology
from rocshare.core.cumask import cu_count_for, mask_from_ranges, ranges_from_mask
from rocshare.core.holdings import Held, record_holding
from rocshare.core.inventory import GpuSpec
from rocshare.core.ledger import GpuUsage
from rocshare.core.resize import (
    DRA_CLAIM_REASON, INSUFFICIENT_CORES_REASON, INSUFFICIENT_MEMORY_REASON, INVALID_REQUEST_REASON,
    QUOTA_EXCEEDED_REASON, REASONS, WHOLE_DEVICE_REASON,
    Neighbours, Refusal, Resized, covering, decide_resize,
)
from tests.unit.core.helpers import gpu, node

GPU0 = "GPU-n1-0000"
NO_LIMITS = ShareLimits()


def slice_record(memory_mib: int = 4096, ranges=((0, 9),), pct: int | None = 10, *, name: str = "app",
                 extra: tuple[ContainerAllocation, ...] = ()) -> AllocationRecord:
    cus = sum(high - low + 1 for low, high in ranges)
    device = DeviceSlice(gpu_id=GPU0, memory_mib=memory_mib, cu_ranges=list(ranges), cu_count=cus, cores_pct=pct)
    return AllocationRecord(node="n1", containers=[ContainerAllocation(name=name, devices=[device]), *extra])


def neighbours(memory_mib: int = 0, ranges=(), *, limits: ShareLimits = NO_LIMITS, used: Held = Held()) -> Neighbours:
    usage = GpuUsage(memory_mib, 1 if memory_mib or ranges else 0, mask_from_ranges(ranges))
    return Neighbours({GPU0: usage}, limits, used)


def ask(generation: int = 1, **fields) -> ResizeRequest:
    return ResizeRequest(generation=generation, **fields)


MI210 = node(gpu(0, memory_mib=65536, cu_count=104))


def test_grow_memory_and_cores_next_to_its_own_cus():
    decided = decide_resize(slice_record(), ask(memory_mib=8192, cores_pct=20), MI210, neighbours())
    assert isinstance(decided, Resized)
    device = decided.record.containers[0].devices[0]
    # 20 % of 104 CUs = ceil(20.8) = 21, its own 0-9 kept and 10-20 added beside them.
    assert (device.memory_mib, device.cu_count, device.cu_ranges, device.cores_pct) == (8192, 21, [(0, 20)], 20)
    assert decided.record.resize_generation == 1 and decided.record.generation == 1
    assert "4096 -> 8192 MiB" in decided.summary and "10 -> 21 CUs" in decided.summary


def test_grow_goes_downward_when_the_neighbour_sits_above():
    record = slice_record(ranges=((20, 29),))
    decided = decide_resize(record, ask(cores_pct=20), MI210, neighbours(ranges=((30, 103),)))
    assert isinstance(decided, Resized)
    assert decided.record.containers[0].devices[0].cu_ranges == [(9, 29)]


def test_grow_takes_free_cus_elsewhere_when_none_adjoin():
    record = slice_record(ranges=((10, 19),))
    held = ((0, 9), (20, 49))
    decided = decide_resize(record, ask(cores_pct=20), MI210, neighbours(ranges=held))
    assert isinstance(decided, Resized)
    mask = mask_from_ranges(decided.record.containers[0].devices[0].cu_ranges)
    assert mask.bit_count() == 21 and mask & mask_from_ranges(((10, 19),)) == mask_from_ranges(((10, 19),))
    assert not mask & mask_from_ranges(held)


def test_grow_refused_when_a_neighbour_holds_the_cus():
    decided = decide_resize(slice_record(), ask(cores_pct=50), MI210, neighbours(ranges=((10, 103),)))
    assert isinstance(decided, Refusal) and decided.reason == INSUFFICIENT_CORES_REASON
    assert "52 of its 104 CUs" in decided.message and "has 10 and 0 more are free" in decided.message


def test_grow_refused_when_the_gpu_memory_is_short():
    decided = decide_resize(slice_record(), ask(memory_mib=40000), MI210, neighbours(memory_mib=30000))
    assert isinstance(decided, Refusal) and decided.reason == INSUFFICIENT_MEMORY_REASON
    assert "35536 MiB is the most" in decided.message


def test_memory_up_to_the_gpu_exactly_fits():
    decided = decide_resize(slice_record(), ask(memory_mib=35536), MI210, neighbours(memory_mib=30000))
    assert isinstance(decided, Resized)


def test_quota_counts_only_the_growth():
    limits = ShareLimits(memory_mib=10000, cores_pct=30)
    used = Held(4096 + 4000, 10 + 10, 2)  # this pod (4096 MiB, 10 %) and another (4000 MiB, 10 %)
    ok = decide_resize(slice_record(), ask(memory_mib=5999, cores_pct=20), MI210,
                       neighbours(limits=limits, used=used))
    assert isinstance(ok, Resized)
    over = decide_resize(slice_record(), ask(memory_mib=6001), MI210, neighbours(limits=limits, used=used))
    assert isinstance(over, Refusal) and over.reason == QUOTA_EXCEEDED_REASON
    assert "memory MiB: 8096 used + 1905 asked > 10000 limit" in over.message


def test_shrink_is_allowed_even_over_quota_and_keeps_the_lowest_cus():
    limits = ShareLimits(memory_mib=1000)  # lowered below what the namespace holds
    decided = decide_resize(slice_record(ranges=((0, 20),), pct=20), ask(memory_mib=2048, cores_pct=5), MI210,
                            neighbours(limits=limits, used=Held(4096, 20, 1)))
    assert isinstance(decided, Resized)
    device = decided.record.containers[0].devices[0]
    assert (device.memory_mib, device.cu_ranges, device.cu_count) == (2048, [(0, 5)], 6)


def test_rdna_grows_whole_wgps():
    rdna = node(gpu(0, memory_mib=24576, cu_count=96, gfx=110000, cu_per_wgp=2))
    decided = decide_resize(slice_record(ranges=((0, 9),)), ask(cores_pct=15), rdna, neighbours())
    assert isinstance(decided, Resized)
    device = decided.record.containers[0].devices[0]
    assert device.cu_count == 16 and device.cu_ranges == [(0, 15)]


def test_isolated_layout_grows_inside_the_xcc_it_uses():
    topology = CuTopology(xcc_count=8, se_per_xcc=4, sh_per_se=1, cu_per_sh_max=10, cu_active=304)
    spec = GpuSpec(gpu_id="GPU-n1-0000", index=0, memory_mib=196608, cu_count=304, topology=topology,
                   cu_layout=CuLayout.ISOLATED)
    mi300 = node(spec)
    xcc0 = topology.xcc_masks[0]
    own = [bit for bit in range(304) if xcc0 >> bit & 1][:10]
    record = slice_record(ranges=tuple((b, b) for b in own), pct=4)
    decided = decide_resize(record, ask(cores_pct=10), mi300, neighbours())
    assert isinstance(decided, Resized)
    mask = mask_from_ranges(decided.record.containers[0].devices[0].cu_ranges)
    assert mask.bit_count() == 31 and mask & ~xcc0 == 0  # 31 of XCC 0's 38: beside its own, not across XCDs


def test_whole_gpu_and_init_and_unknown_container_are_refused():
    whole = AllocationRecord(node="n1", containers=[ContainerAllocation(name="app", devices=[
        DeviceSlice(gpu_id=GPU0, memory_mib=65536, cu_count=104, whole=True)])])
    refused = decide_resize(whole, ask(memory_mib=100), MI210, neighbours())
    assert isinstance(refused, Refusal) and refused.reason == WHOLE_DEVICE_REASON
    init = ContainerAllocation(name="setup", init=True, devices=[DeviceSlice(gpu_id=GPU0, memory_mib=100, cu_count=1,
                                                                            cu_ranges=[(0, 0)], cores_pct=1)])
    record = AllocationRecord(node="n1", containers=[init, *slice_record().containers])
    refused = decide_resize(record, ask(memory_mib=100, container="setup"), MI210, neighbours())
    assert isinstance(refused, Refusal) and refused.reason == INVALID_REQUEST_REASON
    assert "init container" in refused.message
    refused = decide_resize(record, ask(memory_mib=100, container="nope"), MI210, neighbours())
    assert isinstance(refused, Refusal) and refused.reason == INVALID_REQUEST_REASON and "setup, app" in refused.message
    # Without a name, the only app container with a slice is meant (the init container ran already).
    assert isinstance(decide_resize(record, ask(memory_mib=100), MI210, neighbours()), Resized)


def test_two_sliced_containers_need_a_name():
    second = slice_record(ranges=((50, 59),), name="side").containers[0]
    record = slice_record(extra=(second,))
    refused = decide_resize(record, ask(cores_pct=20), MI210, neighbours())
    assert isinstance(refused, Refusal) and refused.reason == INVALID_REQUEST_REASON and "app, side" in refused.message
    # Named: it grows beside its own CUs, never into its sibling's 50-59.
    decided = decide_resize(record, ask(cores_pct=20, container="app"), MI210, neighbours())
    assert isinstance(decided, Resized)
    assert decided.record.containers[0].devices[0].cu_ranges == [(0, 20)]
    decided = decide_resize(record, ask(cores_pct=20, container="side"), MI210, neighbours())
    assert isinstance(decided, Resized)
    assert decided.record.containers[1].devices[0].cu_ranges == [(50, 70)]


def test_covering_holds_the_larger_of_both_and_counts_once():
    old = slice_record(memory_mib=8192, ranges=((0, 20),), pct=20)
    decided = decide_resize(old, ask(memory_mib=2048, cores_pct=30), MI210, neighbours())
    assert isinstance(decided, Resized)
    cover = covering(old, decided.record)
    hold = record_holding(cover).gpus[0]
    new_mask = mask_from_ranges(decided.record.containers[0].devices[0].cu_ranges)
    assert hold.memory_mib == 8192 and hold.cu_mask == new_mask | mask_from_ranges(((0, 20),))
    assert hold.cores_pct == 30 and hold.slices == 1  # one slice, not old + new


def test_record_generation_round_trips_and_old_records_read_zero():
    old = slice_record()
    assert "resizeGeneration" not in encode_record(old) and decode_record(encode_record(old)).generation == 0
    grown = old.model_copy(update={"resize_generation": 3})
    assert decode_record(encode_record(grown)).generation == 3


def test_request_codec():
    request = ask(4, memory_mib=8192, cores_pct=50, container="app")
    text = encode_request(request)
    assert text == '{"container":"app","coresPct":50,"generation":4,"memoryMiB":8192,"version":1}'
    assert decode_request(text) == request and request_generation(text) == 4
    assert request_generation(None) == 0 and request_generation("{") == 0


@pytest.mark.parametrize(("text", "problem"), [
    ("[1]", "must be a JSON object"),
    ('{"version":2,"generation":1,"memoryMiB":1}', "unsupported version 2"),
    ('{"version":1,"generation":0,"memoryMiB":1}', "generation"),
    ('{"version":1,"generation":1}', "names memoryMiB, coresPct or both"),
    ('{"version":1,"generation":1,"coresPct":101}', "coresPct"),
    ('{"version":1,"generation":1,"memoryMiB":1,"node":"x"}', "node"),
])
def test_request_codec_names_the_problem(text, problem):
    with pytest.raises(ResizeError, match=problem):
        decode_request(text)


def test_reasons_are_distinct():
    assert len(set(REASONS)) == len(REASONS) and DRA_CLAIM_REASON in REASONS


@settings(max_examples=100, deadline=None)
@given(own_start=st.integers(0, 90), own_len=st.integers(1, 13), others=st.integers(0, (1 << 104) - 1),
       pct=st.integers(1, 100), rdna=st.booleans())
def test_a_resize_never_takes_a_neighbours_cu_and_keeps_its_own_when_growing(own_start, own_len, others, pct, rdna):
    cu_total, align = (96, 2) if rdna else (104, 1)
    spec = gpu(0, cu_count=cu_total, gfx=110000 if rdna else 90010, cu_per_wgp=2 if rdna else 1)
    start = own_start // align * align
    own = mask_from_ranges(((start, min(cu_total, start + own_len * align) - 1),))
    others &= ((1 << cu_total) - 1) & ~own
    record = slice_record(ranges=ranges_from_mask(own), pct=None)
    decided = decide_resize(record, ask(cores_pct=pct), node(spec),
                            Neighbours({GPU0: GpuUsage(0, 1, others)}, NO_LIMITS, Held()))
    need = cu_count_for(pct, cu_total, align)
    free = ((1 << cu_total) - 1) & ~others
    unit = (1 << align) - 1
    free_cus = sum(align for bit in range(0, cu_total, align) if (free >> bit) & unit == unit)
    if isinstance(decided, Refusal):
        assert decided.reason == INSUFFICIENT_CORES_REASON and free_cus < need
        return
    mask = mask_from_ranges(decided.record.containers[0].devices[0].cu_ranges)
    assert mask.bit_count() == need and not mask & others
    assert (mask & own == own) if need >= own.bit_count() else (mask & ~own == 0)
