"""Where each CU mask bit lands, against tables worked out by hand from the comment and loop of
amdkfd's ``mqd_symmetrically_map_cu_mask`` (kfd_mqd_manager.c). The comment says:

    Assuming 2 SH/SE, 4 SEs
    cu_mask[0] bit0 -> se_mask[0] bit0 (SE0,SH0,CU0)
    cu_mask[0] bit1 -> se_mask[1] bit0 (SE1,SH0,CU0)
    ...
    cu_mask[0] bit4 -> se_mask[0] bit16 (SE0,SH1,CU0)
    ...
    cu_mask[0] bit8 -> se_mask[0] bit1 (SE0,SH0,CU1)
    For GFX 9.4.3 ... cu_mask[0] bit0 -> XCC0, bit1 -> XCC1, ... (bit i -> XCC i mod n)

and the loop steps by two bits (one WGP) from GFX 10, skipping an array whose active CUs are used
up. The tables below are written out per shape, as (xcc, se, sh, cu) per bit, without the
product's rule. Where the active CUs do not divide evenly over the arrays (MI300X: 38 over 4), the
two extra CUs are taken to sit on the first arrays in the loop's order (SE0, SE1): KFD properties
do not say which, the product documents the same assumption, and those two bits are marked.
"""

from __future__ import annotations

import pytest

from rocshare.core.cu_topology import CuTopology


def _sites(topology: CuTopology) -> list[tuple[int, int, int, int]]:
    return [(site.xcc, site.se, site.sh, site.cu) for site in topology.sites]


# MI210 (gfx90a, the capture's numbers): array_count 8, simd_arrays_per_engine 1 -> 8 engines of one
# array, 14 CU slots, 104 active = 13 per engine. Round-robin over the 8 engines, 13 rounds.
MI210 = dict(num_xcc=1, array_count=8, simd_arrays_per_engine=1, cu_per_simd_array=14, cu_count=104,
             gfx_target_version=90010)
MI210_TABLE_HEAD = [
    (0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 0, 0), (0, 3, 0, 0), (0, 4, 0, 0), (0, 5, 0, 0), (0, 6, 0, 0), (0, 7, 0, 0),
    (0, 0, 0, 1), (0, 1, 0, 1), (0, 2, 0, 1), (0, 3, 0, 1), (0, 4, 0, 1), (0, 5, 0, 1), (0, 6, 0, 1), (0, 7, 0, 1),
]
MI210_TABLE_TAIL = [  # bits 96..103: the 13th round
    (0, 0, 0, 12), (0, 1, 0, 12), (0, 2, 0, 12), (0, 3, 0, 12),
    (0, 4, 0, 12), (0, 5, 0, 12), (0, 6, 0, 12), (0, 7, 0, 12),
]

# MI308X in CPX mode: one XCC per partition, 4 engines x 1 array x 10 slots, 20 active = 5 per engine.
MI308X_CPX = dict(num_xcc=1, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10, cu_count=20,
                  gfx_target_version=90402)
MI308X_CPX_TABLE = [
    (0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 0, 0), (0, 3, 0, 0),
    (0, 0, 0, 1), (0, 1, 0, 1), (0, 2, 0, 1), (0, 3, 0, 1),
    (0, 0, 0, 2), (0, 1, 0, 2), (0, 2, 0, 2), (0, 3, 0, 2),
    (0, 0, 0, 3), (0, 1, 0, 3), (0, 2, 0, 3), (0, 3, 0, 3),
    (0, 0, 0, 4), (0, 1, 0, 4), (0, 2, 0, 4), (0, 3, 0, 4),
]

# RX 7900 XTX (gfx1100, the capture's numbers): array_count 12, 2 arrays per engine -> 6 engines,
# 8 slots, 96 active = 8 per array. WGP mode: two bits per step; order per CU pair: SH0 SE0..SE5,
# then SH1 SE0..SE5.
RX7900XTX = dict(num_xcc=1, array_count=12, simd_arrays_per_engine=2, cu_per_simd_array=8, cu_count=96,
                 gfx_target_version=110000)
RX7900XTX_TABLE_HEAD = [
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), (0, 2, 0, 0), (0, 2, 0, 1),
    (0, 3, 0, 0), (0, 3, 0, 1), (0, 4, 0, 0), (0, 4, 0, 1), (0, 5, 0, 0), (0, 5, 0, 1),
    (0, 0, 1, 0), (0, 0, 1, 1), (0, 1, 1, 0), (0, 1, 1, 1), (0, 2, 1, 0), (0, 2, 1, 1),
    (0, 3, 1, 0), (0, 3, 1, 1), (0, 4, 1, 0), (0, 4, 1, 1), (0, 5, 1, 0), (0, 5, 1, 1),
    (0, 0, 0, 2), (0, 0, 0, 3),  # bit 24: the second round starts at SE0 SH0, CU pair 2-3
]
RX7900XTX_TABLE_TAIL = [(0, 5, 1, 6), (0, 5, 1, 7)]  # bits 94, 95: the last WGP

# Strix Point APU (gfx1150, the capture's numbers): array_count 2, 2 arrays per engine -> 1 engine,
# 8 slots, 12 active = 6 per array (3 WGPs each).
STRIX = dict(num_xcc=1, array_count=2, simd_arrays_per_engine=2, cu_per_simd_array=8, cu_count=12,
             gfx_target_version=110500)
STRIX_TABLE = [
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 1, 1),
    (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 2), (0, 0, 1, 3),
    (0, 0, 0, 4), (0, 0, 0, 5), (0, 0, 1, 4), (0, 0, 1, 5),
]

# MI300X in SPX mode (derived from the CPX capture: num_xcc 8, 304 CUs; per XCC 4 engines x 1 array
# x 10 slots, 38 active). Bit i -> XCC i mod 8; inside the XCC its j-th bit (j = i div 8) goes
# round-robin over the 4 engines for 9 full rounds (j < 36), then j = 36 -> SE0 CU9, j = 37 -> SE1
# CU9 (the assumed placement of the two CUs past 36).
MI300X_SPX = dict(num_xcc=8, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10, cu_count=304,
                  gfx_target_version=90402)
MI300X_SPX_TABLE_HEAD = [  # bits 0..15: XCC 0..7 at SE0 CU0, then XCC 0..7 at SE1 CU0
    (0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0), (4, 0, 0, 0), (5, 0, 0, 0), (6, 0, 0, 0), (7, 0, 0, 0),
    (0, 1, 0, 0), (1, 1, 0, 0), (2, 1, 0, 0), (3, 1, 0, 0), (4, 1, 0, 0), (5, 1, 0, 0), (6, 1, 0, 0), (7, 1, 0, 0),
]
MI300X_SPX_TABLE_ROWS = {
    32: (0, 0, 0, 1),  # j = 4: second round, SE0
    39: (7, 0, 0, 1),
    287: (7, 3, 0, 8),  # j = 35: last bit of the 9th round
    288: (0, 0, 0, 9),  # j = 36: assumed extra CU of SE0  (inexact)
    303: (7, 1, 0, 9),  # j = 37: assumed extra CU of SE1  (inexact)
}


def test_mi210_table() -> None:
    sites = _sites(CuTopology.from_kfd(**MI210))
    assert len(sites) == 104
    assert sites[:16] == MI210_TABLE_HEAD
    assert sites[96:] == MI210_TABLE_TAIL
    assert sites[8 * 6 + 3] == (0, 3, 0, 6)  # bit 51 = round 6, SE3
    assert CuTopology.from_kfd(**MI210).exact


def test_mi308x_cpx_table() -> None:
    topology = CuTopology.from_kfd(**MI308X_CPX)
    assert _sites(topology) == MI308X_CPX_TABLE
    assert topology.exact


def test_rx7900xtx_table() -> None:
    sites = _sites(CuTopology.from_kfd(**RX7900XTX))
    assert len(sites) == 96
    assert sites[:26] == RX7900XTX_TABLE_HEAD
    assert sites[94:] == RX7900XTX_TABLE_TAIL


def test_strix_point_table() -> None:
    assert _sites(CuTopology.from_kfd(**STRIX)) == STRIX_TABLE


def test_mi300x_spx_table() -> None:
    topology = CuTopology.from_kfd(**MI300X_SPX)
    sites = _sites(topology)
    assert len(sites) == 304
    assert sites[:16] == MI300X_SPX_TABLE_HEAD
    for bit, expected in MI300X_SPX_TABLE_ROWS.items():
        assert sites[bit] == expected, bit
    assert all(site[0] == bit % 8 for bit, site in enumerate(sites))  # XCC exact for every bit
    assert not topology.exact


def test_mi300x_spx_whole_xcd_is_every_eighth_bit() -> None:
    topology = CuTopology.from_kfd(**MI300X_SPX)
    assert topology.xcc_masks[3] == sum(1 << bit for bit in range(3, 304, 8))
    assert [mask.bit_count() for mask in topology.xcc_masks] == [38] * 8


@pytest.mark.parametrize("array_count", [4, 32])
def test_mi300x_spx_array_count_read_per_xcc_or_per_node(array_count: int) -> None:
    """A kernel that writes one XCC's arrays (4) and one that counts all 8 XCCs' (32) give one shape."""
    topology = CuTopology.from_kfd(**{**MI300X_SPX, "array_count": array_count})
    assert (topology.xcc_count, topology.se_per_xcc, topology.sh_per_se) == (8, 4, 1)


def test_counts_that_describe_no_shape_are_none() -> None:
    assert CuTopology.from_kfd(**{**MI210, "array_count": 0}) is None
    assert CuTopology.from_kfd(**{**MI210, "cu_count": 200}) is None  # more CUs than 8 x 14 slots
    assert CuTopology.from_kfd(**{**MI300X_SPX, "cu_count": 301}) is None  # does not divide over 8 XCCs


def test_tenants_by_unit_on_an_mi210_counts_each_engines_cus() -> None:
    """One engine is the unit on a one-XCC GPU: bit i is on engine i mod 8 (the MI210 table above)."""
    topology = CuTopology.from_kfd(**MI210)
    two_engines = sum(1 << bit for bit in range(104) if bit % 8 in (0, 1))  # 26 CUs
    first_ten = (1 << 10) - 1  # a contiguous range: bits 0-9, engines 0-7 and again 0, 1
    unit, units = topology.tenants_by_unit({"a": two_engines, "b": first_ten, "shared": 0})
    assert unit == "SE" and len(units) == 8
    assert units[0] == {"a": 13, "b": 2, "shared": 13} and units[1] == {"a": 13, "b": 2, "shared": 13}
    assert all(units[se] == {"b": 1, "shared": 13} for se in range(2, 8))
