"""CU counts, range choice (best fit, WGP alignment, no needless fragmentation) and HSA_CU_MASK text."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import DeviceSlice
from rocshare.core.cumask import (
    choose_cu_ranges, cu_count_for, free_gaps, mask_from_ranges, ranges_from_mask, render_hsa_cu_mask,
)


@pytest.mark.parametrize(
    ("pct", "total", "align", "expected"),
    [(25, 104, 1, 26), (1, 104, 1, 2), (1, 10, 1, 1), (100, 304, 1, 304), (33, 96, 2, 32), (1, 96, 2, 2), (50, 60, 2, 30),
     (51, 60, 2, 32)],
)
def test_cu_count_ceil_and_wgp_round_up(pct, total, align, expected):
    assert cu_count_for(pct, total, align) == expected


def test_mask_round_trip():
    ranges = [(0, 3), (8, 8), (10, 20)]
    assert ranges_from_mask(mask_from_ranges(ranges)) == ranges


def test_best_fit_picks_smallest_gap_from_its_low_end():
    held = mask_from_ranges([(10, 19), (30, 99)])  # gaps: 0-9 (10), 20-29 (10), 100-103 (4)
    assert choose_cu_ranges(held, 104, 4) == [(100, 103)]
    assert choose_cu_ranges(held, 104, 8) == [(0, 7)]


def test_falls_back_to_several_gaps_largest_first():
    held = mask_from_ranges([(10, 19), (30, 99)])
    assert choose_cu_ranges(held, 104, 15) == [(0, 9), (20, 24)]
    assert choose_cu_ranges(held, 104, 25) is None


def test_rdna_ranges_are_whole_wgps():
    held = mask_from_ranges([(0, 0)])  # half a WGP held: that WGP is not free
    assert free_gaps(held, 8, 2) == [(2, 6)]
    assert choose_cu_ranges(held, 8, 4, 2) == [(2, 5)]


def test_freeing_and_reuse_leaves_one_gap():
    held = 0
    first = choose_cu_ranges(held, 100, 30)
    held |= mask_from_ranges(first)
    second = choose_cu_ranges(held, 100, 30)
    held |= mask_from_ranges(second)
    held &= ~mask_from_ranges(first)  # the first tenant leaves
    again = choose_cu_ranges(held, 100, 20)
    assert again == [(0, 19)]  # reuses the freed hole (30 wide) rather than the tail (40 wide)


def test_render_hsa_cu_mask():
    devices = [
        DeviceSlice(gpu_id="a", memory_mib=1, cu_ranges=[(0, 25)], cu_count=26),
        DeviceSlice(gpu_id="b", memory_mib=1, cu_count=104, whole=True),
        DeviceSlice(gpu_id="c", memory_mib=1, cu_ranges=[(0, 3), (8, 8)], cu_count=5),
    ]
    assert render_hsa_cu_mask(devices) == "0:0-25;2:0-3,8"
    assert render_hsa_cu_mask(devices[1:2]) == ""
