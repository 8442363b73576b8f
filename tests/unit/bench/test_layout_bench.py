"""The layout bench's isolation figures, on records whose XCDs are worked out here (bit i on XCD i mod 8)."""

from __future__ import annotations

from rocshare.api.allocation import AllocationRecord
from rocshare_dev.bench.layout import isolation_figures


def _record(*ranges: list[tuple[int, int]]) -> AllocationRecord:
    return AllocationRecord.model_validate({"node": "n", "containers": [
        {"name": "c", "devices": [{"gpuId": "g", "memoryMiB": 1, "cuCount": sum(h - l + 1 for l, h in r),
                                   "cuRanges": r}]} for r in ranges]})


def test_whole_xcd_slices_on_disjoint_xcds_share_nothing() -> None:
    xcds_0_1 = [(b, b + 1) for b in range(0, 304, 8)]  # 76 bits on XCDs 0 and 1
    xcds_2_3 = [(b + 2, b + 3) for b in range(0, 304, 8)]
    figures = isolation_figures([_record(xcds_0_1), _record(xcds_2_3)], "mi300x")
    assert figures["co_resident_pairs"] == 1 and figures["pairs_sharing_unit_pct"] == 0.0
    assert figures["mean_tenants_per_unit"] == 1.0
    assert (figures["whole_unit_slices"], figures["whole_unit_slices_sharing_pct"]) == (2, 0.0)


def test_contiguous_slices_share_every_xcd() -> None:
    figures = isolation_figures([_record([(0, 75)]), _record([(76, 151)])], "mi300x")
    assert figures["pairs_sharing_unit_pct"] == 100.0 and figures["mean_tenants_per_unit"] == 2.0
    assert figures["whole_unit_slices_sharing_pct"] == 100.0
