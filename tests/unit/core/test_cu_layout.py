"""The layout rule (Isolated / Packed) through the allocator and alone. Which XCD or engine a bit
lands on is read with the test's own tables, worked out from the kernel's comment (see
test_cu_topology): MI300X SPX bit i -> XCD i mod 8; MI210 bit i -> SE i mod 8."""

from __future__ import annotations

import random

from rocshare.api.models import CuLayout, CuTopologyInfo, GpuInfo, Sharing
from rocshare.core.allocate import allocate
from rocshare.core.cu_layout import choose_cus
from rocshare.core.cu_topology import CuTopology
from rocshare.core.cumask import full_mask, mask_from_ranges
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import parse_pod

from .helpers import pod


def _bits(ranges) -> list[int]:
    return [bit for low, high in ranges for bit in range(low, high + 1)]


def mi300x_xcd(bit: int) -> int:
    return bit % 8


def mi210_se(bit: int) -> int:
    return bit % 8


def _gpu_info(*, cu_count: int, gfx: int, topology: CuTopologyInfo | None, cu_per_wgp: int = 1) -> GpuInfo:
    return GpuInfo(id="GPU-0000000000000001", index=0, gfx_target_version=gfx, vram_mib=196608, cu_count=cu_count,
                   cu_per_wgp=cu_per_wgp, pci_bdf="0000:05:00.0", split_count=10, healthy=True,
                   cu_topology=topology)


MI300X_SPX = dict(cu_count=304, gfx=90402,
                  topology=CuTopologyInfo(num_xcc=8, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10))
MI210 = dict(cu_count=104, gfx=90010,
             topology=CuTopologyInfo(num_xcc=1, array_count=8, simd_arrays_per_engine=1, cu_per_simd_array=14))


def _place_slices(info: GpuInfo, sharing: Sharing, pcts: list[int]) -> list[list[int]]:
    inventory = NodeInventory.from_gpu_infos("n1", [info], sharing)
    ledger = Ledger()
    found = []
    for n, pct in enumerate(pcts):
        record = allocate(inventory, ledger.usage(inventory),
                          parse_pod(pod({"amd.com/gpumem": 1000, "amd.com/gpucores": pct})), Policy())
        assert not isinstance(record, FitFailure), record
        ledger.apply(record, PodKey(f"ns/p{n}"))
        found.append(_bits(record.containers[0].devices[0].cu_ranges))
    return found


def test_two_quarter_slices_on_an_mi300x_spx_take_disjoint_whole_xcds_by_default() -> None:
    first, second = _place_slices(_gpu_info(**MI300X_SPX), Sharing(), [25, 25])
    assert len(first) == len(second) == 76  # ceil(304 x 25 %)
    xcds_first, xcds_second = {mi300x_xcd(b) for b in first}, {mi300x_xcd(b) for b in second}
    assert len(xcds_first) == len(xcds_second) == 2  # two whole XCDs of 38 CUs each
    assert not xcds_first & xcds_second
    assert not set(first) & set(second)


def test_packed_spreads_a_quarter_slice_over_every_xcd() -> None:
    first, second = _place_slices(_gpu_info(**MI300X_SPX), Sharing(cu_layout=CuLayout.PACKED), [25, 25])
    assert first == list(range(76)) and second == list(range(76, 152))
    assert {mi300x_xcd(b) for b in first} == {mi300x_xcd(b) for b in second} == set(range(8))


def test_mi210_quarter_slices_take_whole_shader_engines() -> None:
    slices = _place_slices(_gpu_info(**MI210), Sharing(), [25, 25, 25])
    engines = [{mi210_se(b) for b in bits} for bits in slices]
    assert [len(bits) for bits in slices] == [26, 26, 26]
    assert [len(e) for e in engines] == [2, 2, 2]  # 26 CUs = two engines of 13
    assert not (engines[0] & engines[1]) and not (engines[1] & engines[2]) and not (engines[0] & engines[2])


def test_small_slices_share_one_engine_before_breaking_a_free_one() -> None:
    slices = _place_slices(_gpu_info(**MI210), Sharing(), [5, 5])  # 6 CUs each, 13 per engine
    assert {mi210_se(b) for b in slices[0]} == {mi210_se(b) for b in slices[1]} == {0}


def test_a_pool_without_topology_is_packed_as_before() -> None:
    first, = _place_slices(_gpu_info(cu_count=304, gfx=90402, topology=None), Sharing(), [25])
    assert first == list(range(76))


def test_rdna_isolated_keeps_whole_wgps_and_engines() -> None:
    info = _gpu_info(cu_count=96, gfx=110000, cu_per_wgp=2, topology=CuTopologyInfo(
        num_xcc=1, array_count=12, simd_arrays_per_engine=2, cu_per_simd_array=8))
    slices = _place_slices(info, Sharing(cu_layout=CuLayout.ISOLATED), [17, 17])  # 17 CUs -> 18, whole WGPs
    for bits in slices:
        assert len(bits) == 18
        assert all((b ^ 1) in bits for b in bits)  # both CUs of each WGP (bits 2k, 2k+1)
    # by the hand table: WGP step k = bit // 2 lands on SE k mod 6 (16 CUs per engine)
    engines = [{(b // 2) % 6 for b in bits} for bits in slices]
    whole = [{se for se in found if sum((b // 2) % 6 == se for b in bits) == 16}
             for found, bits in zip(engines, slices)]
    assert [len(w) for w in whole] == [1, 1] and not whole[0] & whole[1]  # a whole engine each, not the same
    assert len(engines[0] & engines[1]) == 1  # the 2-CU rests share one engine rather than break a second
    assert not set(slices[0]) & set(slices[1])


def test_random_isolated_allocations_stay_disjoint_exact_and_whole_wgps() -> None:
    rng = random.Random(41)
    shapes = [(CuTopology.from_kfd(num_xcc=8, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10,
                                   cu_count=304, gfx_target_version=90402), 1),
              (CuTopology.from_kfd(num_xcc=1, array_count=12, simd_arrays_per_engine=2, cu_per_simd_array=8,
                                   cu_count=96, gfx_target_version=110000), 2)]
    for topology, align in shapes:
        held: dict[int, int] = {}
        for step in range(400):
            used = 0
            for mask in held.values():
                used |= mask
            if held and rng.random() < 0.4:
                held.pop(rng.choice(sorted(held)))
                continue
            need = rng.randrange(1, topology.cu_active // 3) // align * align or align
            ranges = choose_cus(used, topology.cu_active, need, align, CuLayout.ISOLATED, topology)
            free = topology.cu_active - used.bit_count()
            if ranges is None:
                assert free < need
                continue
            mask = mask_from_ranges(ranges)
            assert mask.bit_count() == need and not mask & used and mask <= full_mask(topology.cu_active)
            assert all(((mask >> b) & 3) in (0, 3) for b in range(0, topology.cu_active, align)) if align == 2 else True
            held[step] = mask
