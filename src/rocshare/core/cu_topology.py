"""Which bit of a CU mask lands on which XCC, shader engine, shader array and CU. Pure.

The rule is the kernel's: amdkfd ``mqd_symmetrically_map_cu_mask``
(drivers/gpu/drm/amd/amdkfd/kfd_mqd_manager.c) turns a queue's CU mask (what ROCr builds from
``HSA_CU_MASK``) into the per-shader-engine registers. Its loop, per XCC instance ``inst`` of the
KFD node, is (paraphrased)::

    i = inst; inc = cu_inc * num_xcc            # cu_inc = 2 on GFX 10+ (WGP mode), else 1
    for cu in 0, cu_inc, ... < 16:              # CU position inside an array
        for sh in shader arrays of an engine:
            for se in shader engines:
                if active CUs of (se, sh) > cu:
                    mask bits i (and i+1 in WGP mode) -> (XCC inst, se, sh, CU cu (and cu+1))
                    i += inc; stop once i >= the node's active CU count

So the bits are dealt round-robin: across the XCCs first (GFX 9.4.3: bit i -> XCC i mod n),
then the shader engines, then the arrays, then CU positions. Hardware compacts disabled CUs,
so the loop skips an array once its active CUs are used up.

The counts come from the KFD node's properties (DESIGN.md section 5): ``num_xcc``,
``array_count`` (shader arrays of one XCC; a kernel that counts every XCC's is read as such
when the per-XCC reading cannot hold the node's CUs), ``simd_arrays_per_engine``,
``cu_per_simd_array`` (the maximum, fused-off CUs included) and the active CU count
(``simd_count / simd_per_cu``). What KFD properties do not say is which arrays lost CUs to
fusing: where the active CUs do not divide evenly over the arrays (MI300X: 38 CUs over 4
arrays of 10), we take them as spread as evenly as possible, the extra ones on the first
arrays in the loop's order, and ``CuTopology.exact`` is False. The XCC of every bit is exact
either way; so is the engine and array of every bit dealt while all arrays still had CUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TypeVar

K = TypeVar("K")

_KERNEL_CU_POSITIONS = 16
"""The kernel's loop stops at CU position 16 (se_mask holds 16 bits per shader array)."""
_WGP_MIN_GFX = 100000
"""GFX 10 and later: the kernel maps the mask in WGP mode, two bits per step."""


@dataclass(frozen=True, slots=True)
class CuSite:
    """Where one mask bit lands: XCC, shader engine and shader array inside it, CU position."""

    xcc: int
    se: int
    sh: int
    cu: int


@dataclass(frozen=True)
class CuTopology:
    """The shape the kernel deals a mask over: XCCs x engines x arrays x CU positions."""

    xcc_count: int
    se_per_xcc: int
    sh_per_se: int
    cu_per_sh_max: int
    cu_active: int
    """Active CUs of the whole node (every XCC)."""
    cu_step: int = 1
    """Bits per step of the kernel's loop: 2 on GFX 10+ (a WGP), else 1."""

    def __post_init__(self) -> None:
        if min(self.xcc_count, self.se_per_xcc, self.sh_per_se, self.cu_per_sh_max, self.cu_active, self.cu_step) < 1:
            raise ValueError(f"every count must be at least 1: {self}")
        if self.cu_active % self.xcc_count:
            raise ValueError(f"{self.cu_active} active CUs do not divide over {self.xcc_count} XCCs")
        if self.cu_per_xcc % self.cu_step:
            raise ValueError(f"{self.cu_per_xcc} CUs per XCC are not whole steps of {self.cu_step}")
        if self.cu_per_xcc > self.arrays_per_xcc * min(self.cu_per_sh_max, _KERNEL_CU_POSITIONS):
            raise ValueError(f"{self.cu_per_xcc} CUs per XCC do not fit {self.arrays_per_xcc} arrays "
                             f"of {self.cu_per_sh_max}")

    @classmethod
    @cache  # one object per shape: thousands of alike GPUs share its tables
    def from_kfd(cls, *, num_xcc: int, array_count: int, simd_arrays_per_engine: int, cu_per_simd_array: int,
                 cu_count: int, gfx_target_version: int) -> CuTopology | None:
        """From KFD node properties; None when they do not describe a shape the loop can deal."""
        num_xcc = max(num_xcc, 1)
        if min(array_count, simd_arrays_per_engine, cu_per_simd_array, cu_count) < 1:
            return None
        arrays_per_xcc = array_count
        if array_count % num_xcc == 0 and array_count * cu_per_simd_array >= cu_count:
            # array_count may count every XCC's arrays; the tighter reading wins when it holds the CUs
            arrays_per_xcc = array_count // num_xcc
        if arrays_per_xcc % simd_arrays_per_engine:
            return None
        try:
            return cls(xcc_count=num_xcc, se_per_xcc=arrays_per_xcc // simd_arrays_per_engine,
                       sh_per_se=simd_arrays_per_engine, cu_per_sh_max=cu_per_simd_array, cu_active=cu_count,
                       cu_step=2 if gfx_target_version >= _WGP_MIN_GFX else 1)
        except ValueError:
            return None

    @property
    def arrays_per_xcc(self) -> int:
        return self.se_per_xcc * self.sh_per_se

    @property
    def cu_per_xcc(self) -> int:
        return self.cu_active // self.xcc_count

    @property
    def exact(self) -> bool:
        """True when the active CUs divide evenly over the arrays (no guess about fused-off CUs)."""
        return (self.cu_per_xcc // self.cu_step) % self.arrays_per_xcc == 0

    def active_per_array(self) -> dict[tuple[int, int], int]:
        """Active CUs per (se, sh) of one XCC: as even as possible, extra steps on the first arrays
        in the kernel's loop order (sh outer, se inner)."""
        steps, extra = divmod(self.cu_per_xcc // self.cu_step, self.arrays_per_xcc)
        order = [(se, sh) for sh in range(self.sh_per_se) for se in range(self.se_per_xcc)]
        return {array: (steps + (k < extra)) * self.cu_step for k, array in enumerate(order)}

    @cached_property
    def sites(self) -> tuple[CuSite, ...]:
        """Per mask bit 0..cu_active-1, where the kernel puts it."""
        active = self.active_per_array()
        found: dict[int, CuSite] = {}
        inc = self.cu_step * self.xcc_count
        for xcc in range(self.xcc_count):
            bit = xcc * self.cu_step
            for cu in range(0, _KERNEL_CU_POSITIONS, self.cu_step):
                for sh in range(self.sh_per_se):
                    for se in range(self.se_per_xcc):
                        if active[(se, sh)] > cu and bit < self.cu_active:
                            for k in range(self.cu_step):
                                found[bit + k] = CuSite(xcc, se, sh, cu + k)
                            bit += inc
        return tuple(found[bit] for bit in range(self.cu_active))

    @cached_property
    def xcc_masks(self) -> tuple[int, ...]:
        """Per XCC, the mask bits that land on it."""
        return self._masks(lambda site: (site.xcc,))

    @cached_property
    def engine_masks(self) -> tuple[int, ...]:
        """Per shader engine (XCC-major order), the mask bits that land on it."""
        return self._masks(lambda site: (site.xcc, site.se))

    @cached_property
    def array_masks(self) -> tuple[int, ...]:
        """Per shader array (XCC, engine, array order), the mask bits that land on it."""
        return self._masks(lambda site: (site.xcc, site.se, site.sh))

    def levels(self) -> tuple[tuple[int, ...], ...]:
        """The nested units, outermost first, leaving out a level that splits nothing (one XCC)."""
        levels = [self.xcc_masks, self.engine_masks, self.array_masks]
        kept = [level for pos, level in enumerate(levels) if pos == 0 or len(level) > len(levels[pos - 1])]
        return tuple(level for level in kept if len(level) > 1)

    def isolation_units(self) -> tuple[str, tuple[int, ...]]:
        """The unit co-tenants are reported by: the XCD where the device has several (each its own
        L2), else the shader engine."""
        return ("XCD", self.xcc_masks) if self.xcc_count > 1 else ("SE", self.engine_masks)

    def tenants_by_unit(self, masks: Mapping[K, int]) -> tuple[str, tuple[dict[K, int], ...]]:
        """The isolation unit's name and, per unit, each holder with CUs on it and how many. `masks`:
        holder -> the mask bits it holds on this GPU; 0 (a slice that reserves no CUs, so runs on
        every one) counts as every CU. The one rule for AmdGpuNode status and the unit metrics."""
        unit, units = self.isolation_units()
        every = (1 << self.cu_active) - 1
        held = {key: mask or every for key, mask in masks.items()}
        return unit, tuple({key: (mask & unit_mask).bit_count() for key, mask in held.items() if mask & unit_mask}
                           for unit_mask in units)

    def _masks(self, key) -> tuple[int, ...]:
        masks: dict[tuple[int, ...], int] = {}
        for bit, site in enumerate(self.sites):
            masks[key(site)] = masks.get(key(site), 0) | (1 << bit)
        return tuple(masks[k] for k in sorted(masks))
