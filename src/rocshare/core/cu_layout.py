"""The one rule that picks a slice's CU mask bits: every path that hands out CUs calls
``choose_cus`` (the allocator's plans, the extender's, DRA prepare through dra_shares). Pure.

* ``Packed``: contiguous bit ranges, best-fit (rocshare.core.cumask.choose_cu_ranges). The
  kernel deals bits round-robin over XCCs and shader engines (rocshare.core.cu_topology), so a
  contiguous range spreads over all of them: every tenant shares every XCD's L2 and every engine.
* ``Isolated``: bits chosen by where the kernel puts them. A slice takes whole free XCCs while
  its size allows, then whole shader engines, then whole shader arrays, then single CUs (whole
  WGPs on RDNA); what is left after the whole units goes, best-fit, into the one unit with the
  least free room that holds it (a unit others already use before a free one), so whole units
  stay free for slices that fit them and two slices share as few XCCs and engines as they can.
  Only when no single unit holds the rest is it spread over the units with the most free room.

Masks stay disjoint (only free bits are taken) and on RDNA cover whole WGPs: the topology's
units are made of the kernel's WGP pairs, and single CUs are taken a WGP at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocshare.api.models import CuLayout
from rocshare.core.cu_topology import CuTopology
from rocshare.core.cumask import choose_cu_ranges, full_mask, ranges_from_mask


def choose_cus(held_mask: int, cu_total: int, need: int, align: int, layout: CuLayout,
               topology: CuTopology | None) -> list[tuple[int, int]] | None:
    """Inclusive bit ranges holding exactly ``need`` free CUs (a multiple of ``align``), or None."""
    if layout != CuLayout.ISOLATED or topology is None or topology.cu_active != cu_total \
            or topology.cu_step != align:
        return choose_cu_ranges(held_mask, cu_total, need, align)
    free = full_mask(cu_total) & ~held_mask
    if _units_free(free, align, full_mask(cu_total)) < need:
        return None
    chosen = _pick(free, need, align, topology.levels(), full_mask(cu_total))
    return ranges_from_mask(chosen)


def _pick(free: int, need: int, align: int, levels: Sequence[tuple[int, ...]], scope: int) -> int:
    """``need`` free bits inside ``scope``: whole units of the outermost level first, the rest in one unit."""
    if not levels:
        return _lowest_units(free & scope, need, align)
    units = [unit & scope for unit in levels[0] if unit & scope]
    inner = levels[1:]
    chosen = 0
    left = need
    for unit in units:
        size = unit.bit_count()
        if unit & free == unit and size <= left:
            chosen |= unit
            left -= size
    if left == 0:
        return chosen
    free &= ~chosen
    candidates = [(_units_free(free, align, unit), pos) for pos, unit in enumerate(units)
                  if not unit & chosen]
    fitting = [(room, pos) for room, pos in candidates if room >= left]
    if fitting:
        _, pos = min(fitting)
        return chosen | _pick(free, left, align, inner, units[pos])
    for room, pos in sorted(candidates, key=lambda item: (-item[0], item[1])):
        take = min(room, left)
        if take:
            chosen |= _pick(free, take, align, inner, units[pos])
            left -= take
        if left == 0:
            break
    return chosen


def _units_free(free: int, align: int, scope: int) -> int:
    """Free CUs inside ``scope`` counted in whole aligned units (WGPs on RDNA)."""
    inside = free & scope
    if align == 1:
        return inside.bit_count()
    unit_mask = (1 << align) - 1
    count = 0
    bit = 0
    while inside >> bit:
        if (inside >> bit) & unit_mask == unit_mask:
            count += align
        bit += align
    return count


def _lowest_units(free: int, need: int, align: int) -> int:
    """The lowest ``need`` free bits, ``align`` at a time (whole aligned units)."""
    chosen = 0
    unit_mask = (1 << align) - 1
    bit = 0
    while need > 0 and free >> bit:
        if (free >> bit) & unit_mask == unit_mask:
            chosen |= unit_mask << bit
            need -= align
        bit += align
    return chosen
