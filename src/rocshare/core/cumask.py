"""Compute-unit counts, CU index sets and the HSA_CU_MASK text.

A GPU's held CUs are an int bitmask (bit i = CU i held): popcount, union and gap search
stay cheap in plain Python. Invariants: ranges handed out lie inside ``[0, cu_count)``, are
disjoint from the held mask, and on RDNA cover whole WGPs (start and length multiples of
``align``). Ranges are chosen best-fit: the smallest free gap that holds the request, taken
from its low end, so a freed slice leaves one reusable gap instead of slivers. Only when no
single gap is big enough is the request spread over several gaps (largest first, fewest
ranges).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rocshare.api.allocation import DeviceSlice, render_cu_ranges


def cu_count_for(cores_pct: int, cu_total: int, align: int = 1) -> int:
    """CUs for a percentage: ceil(total x pct / 100), at least 1, rounded up to whole WGPs."""
    count = max(1, -(-cu_total * cores_pct // 100))
    if align > 1:
        count = -(-count // align) * align
    return min(count, cu_total)


def full_mask(cu_total: int) -> int:
    return (1 << cu_total) - 1


def mask_from_ranges(ranges: Iterable[tuple[int, int]]) -> int:
    mask = 0
    for low, high in ranges:
        mask |= ((1 << (high - low + 1)) - 1) << low
    return mask


def ranges_from_mask(mask: int) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    position = 0
    while mask:
        skip = (mask & -mask).bit_length() - 1  # index of the lowest set bit
        mask >>= skip
        position += skip
        run = (~mask & (mask + 1)).bit_length() - 1  # length of the run of ones
        ranges.append((position, position + run - 1))
        mask >>= run
        position += run
    return ranges


def free_gaps(held_mask: int, cu_total: int, align: int = 1) -> list[tuple[int, int]]:
    """(start, length) of free runs, in units of ``align`` CUs aligned to ``align``."""
    gaps: list[tuple[int, int]] = []
    unit_mask = (1 << align) - 1
    start = None
    units = cu_total // align
    for unit in range(units):
        free = (held_mask >> (unit * align)) & unit_mask == 0
        if free and start is None:
            start = unit
        elif not free and start is not None:
            gaps.append((start * align, (unit - start) * align))
            start = None
    if start is not None:
        gaps.append((start * align, (units - start) * align))
    return gaps


def choose_cu_ranges(held_mask: int, cu_total: int, need: int, align: int = 1) -> list[tuple[int, int]] | None:
    """Inclusive ranges holding exactly ``need`` CUs (a multiple of align), or None."""
    gaps = free_gaps(held_mask, cu_total, align)
    fitting = [gap for gap in gaps if gap[1] >= need]
    if fitting:
        start, _ = min(fitting, key=lambda gap: (gap[1], gap[0]))
        return [(start, start + need - 1)]
    if sum(length for _, length in gaps) < need:
        return None
    ranges: list[tuple[int, int]] = []
    left = need
    for start, length in sorted(gaps, key=lambda gap: (-gap[1], gap[0])):
        take = min(length, left)
        ranges.append((start, start + take - 1))
        left -= take
        if left == 0:
            break
    return sorted(ranges)


render_ranges = render_cu_ranges  # "0-15,32" (api.allocation: the account's limits file writes it too)


def render_hsa_cu_mask(devices: Sequence[DeviceSlice]) -> str:
    """HSA_CU_MASK for one container: ``<i>:<ranges>`` joined by ``;``, i = GPU position in the
    container. GPUs without ranges (every CU) are left out; "" means set no mask at all."""
    parts = [f"{i}:{render_ranges(d.cu_ranges)}" for i, d in enumerate(devices) if d.cu_ranges]
    return ";".join(parts)
