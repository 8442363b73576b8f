"""Prepare-time planning of DRA shares (rocshare.core.dra_shares): disjoint CU ranges by the
device plugin's own rule, whole WGPs on RDNA, whole GPUs, and the refusals with their reasons.
Expected ranges are worked out here from the gap rule (best fit, low end first)."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.core.dra_shares import (NOT_HONOURED_REASON, NOT_ON_NODE_REASON, AllocatedDevice, Holdings,
                                      ShareError, claim_holding, claim_record, counted_slices,
                                      plan_claim)
from rocshare.core.holdings import Held, record_holding
from rocshare.core.ids import GpuId
from rocshare.core.inventory import GpuSpec

MIB = 2**20
MI210 = GpuSpec(gpu_id=GpuId("GPU-a"), index=0, memory_mib=65536, cu_count=104, gfx_target_version=90010)
RX7900 = GpuSpec(gpu_id=GpuId("GPU-b"), index=1, memory_mib=24560, cu_count=96, gfx_target_version=110000,
                 cu_per_wgp=2)
PARTITION = GpuSpec(gpu_id=GpuId("GPU-c-p0"), index=2, memory_mib=24576, cu_count=38, partition=True)
SPECS = {"gpu-a": MI210, "gpu-b": RX7900, "gpu-c-p0": PARTITION}
NOTHING = Holdings(masks={})


def share(device: str, *, cus: int, mib: int, share_id: str = "s1") -> AllocatedDevice:
    return AllocatedDevice(request="gpu", device=device, share_id=share_id,
                           consumed={"memory": str(mib * MIB), "compute": str(cus), "shares": "1"})


def holdings(*prepared: DeviceSlice) -> Holdings:
    return Holdings.of(prepared, {spec.gpu_id: spec.cu_count for spec in SPECS.values()})


def test_two_shares_get_disjoint_ranges_of_exactly_their_count():
    [first] = plan_claim([share("gpu-a", cus=26, mib=16384)], SPECS, NOTHING)
    # coresPct: what accounting counts, 26 of 104 CUs = 25 % (the agent writes it in the claim's record).
    assert first == DeviceSlice(gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(0, 25)], cu_count=26, cores_pct=25)
    [second] = plan_claim([share("gpu-a", cus=52, mib=8192)], SPECS, holdings(first))
    assert second.cu_ranges == [(26, 77)] and second.memory_mib == 8192
    [third] = plan_claim([share("gpu-a", cus=26, mib=1)], SPECS, holdings(first, second))
    assert third.cu_ranges == [(78, 103)]
    with pytest.raises(ShareError) as refused:
        plan_claim([share("gpu-a", cus=1, mib=1)], SPECS, holdings(first, second, third))
    assert refused.value.reason == NOT_HONOURED_REASON
    assert "no 1 free CUs" in str(refused.value) and "held 0-103" in str(refused.value)


def test_a_freed_gap_is_reused_best_fit():
    a = DeviceSlice(gpu_id="GPU-a", memory_mib=1, cu_ranges=[(0, 9)], cu_count=10)
    c = DeviceSlice(gpu_id="GPU-a", memory_mib=1, cu_ranges=[(30, 103)], cu_count=74)
    # Gaps: 10-29 (20 CUs). A 20-CU share fits it exactly.
    [chosen] = plan_claim([share("gpu-a", cus=20, mib=1)], SPECS, holdings(a, c))
    assert chosen.cu_ranges == [(10, 29)]


def test_rdna_shares_are_whole_wgps_and_an_odd_amount_is_refused():
    [first] = plan_claim([share("gpu-b", cus=10, mib=4096)], SPECS, NOTHING)
    assert first.cu_ranges == [(0, 9)]
    with pytest.raises(ShareError) as refused:
        plan_claim([share("gpu-b", cus=11, mib=4096)], SPECS, holdings(first))
    assert refused.value.reason == NOT_HONOURED_REASON and "whole WGPs of 2" in str(refused.value)


def test_no_capacity_asked_is_the_whole_gpu_and_refused_beside_a_share():
    whole_ask = share("gpu-a", cus=104, mib=65536)
    [whole] = plan_claim([whole_ask], SPECS, NOTHING)
    assert whole == DeviceSlice(gpu_id="GPU-a", memory_mib=65536, cu_count=104, whole=True)
    with pytest.raises(ShareError) as refused:
        plan_claim([share("gpu-a", cus=0, mib=1)], SPECS, holdings(whole))
    assert refused.value.reason == NOT_HONOURED_REASON and "held whole" in str(refused.value)
    small = DeviceSlice(gpu_id="GPU-a", memory_mib=1, cu_ranges=[(0, 0)], cu_count=1)
    with pytest.raises(ShareError, match="wanted whole but other claims hold CUs 0 of it"):
        plan_claim([whole_ask], SPECS, holdings(small))


def test_shared_omitted_cores_pin_nothing_and_partitions_are_whole():
    [free_cus] = plan_claim([share("gpu-a", cus=0, mib=1024)], SPECS, NOTHING)
    assert free_cus == DeviceSlice(gpu_id="GPU-a", memory_mib=1024, cu_count=104)
    [partition] = plan_claim([AllocatedDevice(request="gpu", device="gpu-c-p0")], SPECS, NOTHING)
    assert partition.whole and partition.cu_count == 38


def test_two_shares_of_one_gpu_in_one_claim_do_not_overlap():
    planned = plan_claim([share("gpu-a", cus=10, mib=1, share_id="x"), share("gpu-a", cus=10, mib=1, share_id="y")],
                         SPECS, NOTHING)
    assert [d.cu_ranges for d in planned] == [[(0, 9)], [(10, 19)]]


def test_a_device_that_is_not_here_is_refused():
    with pytest.raises(ShareError) as refused:
        plan_claim([share("gpu-zz", cus=1, mib=1)], SPECS, NOTHING)
    assert refused.value.reason == NOT_ON_NODE_REASON


def test_unknown_vram_cannot_be_shared():
    specs = {"gpu-a": GpuSpec(gpu_id=GpuId("GPU-a"), index=0, memory_mib=0, cu_count=104)}
    with pytest.raises(ShareError, match="VRAM size is unknown"):
        plan_claim([share("gpu-a", cus=10, mib=0)], specs, NOTHING)


def test_memory_only_under_exclusive_holds_every_cu_without_a_mask_as_the_device_plugin_does():
    [memory_only] = plan_claim([share("gpu-a", cus=104, mib=8192)], SPECS, NOTHING)
    assert memory_only == DeviceSlice(gpu_id="GPU-a", memory_mib=8192, cu_count=104, reserves_all_cores=True)
    with pytest.raises(ShareError, match="no 1 free CUs"):
        plan_claim([share("gpu-a", cus=1, mib=1)], SPECS, holdings(memory_only))
    small = DeviceSlice(gpu_id="GPU-a", memory_mib=1, cu_ranges=[(0, 0)], cu_count=1)
    with pytest.raises(ShareError, match="every CU is wanted but other claims hold 0"):
        plan_claim([share("gpu-a", cus=104, mib=8192)], SPECS, holdings(small))


# ---- what an allocated claim holds, before and after the node prepares it ----------------------



def test_a_claim_as_allocated_holds_its_memory_and_the_percent_of_its_cus():
    # 26 of the MI210's 104 CUs is 25 %; 10 of the RX 7900's 96 is ceil(10.42) = 11 %, never under.
    slices = counted_slices([share("gpu-a", cus=26, mib=16384), share("gpu-b", cus=10, mib=4096)], SPECS)
    assert [(s.gpu_id, s.memory_mib, s.cores_pct, s.cu_ranges) for s in slices] == [
        ("GPU-a", 16384, 25, []), ("GPU-b", 4096, 11, [])]
    record = claim_record("c", "n1", [share("gpu-a", cus=26, mib=16384)], None, SPECS)
    assert record_holding(record).held() == Held(memory_mib=16384, cores_pct=25, gpus=1)


def test_whole_all_cores_and_no_compute_are_counted_as_prepare_will_hand_them_out():
    [whole] = counted_slices([share("gpu-a", cus=104, mib=65536)], SPECS)
    [partition] = counted_slices([AllocatedDevice(request="gpu", device="gpu-c-p0")], SPECS)
    [all_cores] = counted_slices([share("gpu-a", cus=104, mib=1024)], SPECS)
    [shared] = counted_slices([share("gpu-a", cus=0, mib=1024)], SPECS)
    held = [record_holding(AllocationRecord(node="n1", containers=[ContainerAllocation(name="c", devices=[s])])).held()
            for s in (whole, partition, all_cores, shared)]
    assert held == [Held(65536, 100, 1), Held(24576, 100, 1), Held(1024, 100, 1), Held(1024, 0, 1)]


def test_the_agents_record_gives_the_cu_positions_when_it_matches_the_allocation():
    prepared = AllocationRecord(node="n1", containers=[ContainerAllocation(name="c", devices=[DeviceSlice(
        gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(26, 51)], cu_count=26, cores_pct=25)])])
    held = claim_holding("c", "n1", [share("gpu-a", cus=26, mib=16384)], encode_record(prepared), SPECS)
    assert held.held == prepared and held.ignored is None and record_holding(held.held).cu_count == 26
    unknown = claim_record("c", "n1", [share("gpu-z", cus=1, mib=1)], None, SPECS)
    assert unknown.startswith(NOT_ON_NODE_REASON) and "gpu-z" in unknown


def test_dra_prepare_lays_out_by_the_pools_layout_like_the_device_plugin_path():
    """Issue 41: the same rule (rocshare.core.cu_layout) at prepare. An MI300X in SPX mode, Isolated:
    76 CUs are two whole XCDs; by the kernel's mapping (GFX 9.4.3, 8 XCCs) bit i is on XCD i mod 8."""
    from rocshare.api.models import CuLayout
    from rocshare.core.cu_topology import CuTopology

    topology = CuTopology.from_kfd(num_xcc=8, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10,
                                   cu_count=304, gfx_target_version=90402)
    mi300x = GpuSpec(gpu_id=GpuId("GPU-x"), index=0, memory_mib=196608, cu_count=304, gfx_target_version=90402,
                     topology=topology, cu_layout=CuLayout.ISOLATED)
    specs = {"gpu-x": mi300x}
    [first] = plan_claim([share("gpu-x", cus=76, mib=16384)], specs, Holdings(masks={}))
    [second] = plan_claim([share("gpu-x", cus=76, mib=16384)], specs,
                          Holdings.of([first], {mi300x.gpu_id: mi300x.cu_count}))
    xcds = [{bit % 8 for low, high in s.cu_ranges for bit in range(low, high + 1)} for s in (first, second)]
    assert [len(x) for x in xcds] == [2, 2] and not xcds[0] & xcds[1]
    assert (first.cu_count, second.cu_count) == (76, 76)


def _written(*devices: DeviceSlice, node: str = "n1") -> str:
    return encode_record(AllocationRecord(node=node, containers=[ContainerAllocation(name="c", devices=list(devices))]))


@pytest.mark.parametrize("written, why", [
    # What a tenant who may patch its claim writes to look as if it held (almost) nothing (issue 39).
    (_written(DeviceSlice(gpu_id="GPU-a", memory_mib=1, cu_ranges=[(0, 0)], cu_count=1, cores_pct=1)),
     "does not match the allocation"),
    (_written(DeviceSlice(gpu_id="GPU-b", memory_mib=16384, cu_ranges=[(0, 25)], cu_count=26, cores_pct=25)),
     "does not match the allocation"),
    (_written(DeviceSlice(gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(0, 9)], cu_count=26, cores_pct=25)),
     "are not 26 CUs of the GPU"),
    (_written(DeviceSlice(gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(100, 125)], cu_count=26, cores_pct=25)),
     "are not 26 CUs of the GPU"),
    (_written(DeviceSlice(gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(0, 25)], cu_count=26, cores_pct=25),
              DeviceSlice(gpu_id="GPU-b", memory_mib=1, cu_ranges=[(0, 1)], cu_count=2, cores_pct=3)),
     "lists 2 device(s), the allocation 1"),
    (_written(DeviceSlice(gpu_id="GPU-a", memory_mib=16384, cu_ranges=[(0, 25)], cu_count=26, cores_pct=25),
              node="n2"), "names node n2, not n1"),
    ("{not json", "cannot be read"),
])
def test_a_record_that_does_not_match_the_allocation_is_ignored_and_the_allocation_counts(written, why):
    record = claim_record("c", "n1", [share("gpu-a", cus=26, mib=16384)], written, SPECS)
    assert record_holding(record).held() == Held(memory_mib=16384, cores_pct=25, gpus=1)
    assert record.containers[0].devices[0].cu_ranges == []
    held = claim_holding("c", "n1", [share("gpu-a", cus=26, mib=16384)], written, SPECS)
    assert held.held == record and held.ignored is not None and why in held.ignored, held.ignored
