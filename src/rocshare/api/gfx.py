"""AMD GPU families from ``gfx_target_version`` (major*10000 + minor*100 + stepping), and what
each family can do with memory oversubscription. Pure.

* RDNA is gfx10 and later: CUs are grouped in WGPs of two, and there is no XNACK (GPU page-fault
  retry), so managed memory cannot back an oversubscribed ``hipMalloc``.
* CDNA is gfx908 (MI100), gfx90a (MI200), gfx94x (MI300) and gfx95x (MI350). With
  ``HIP_OVERSUBSCRIBE=true`` ``hipMalloc`` allocates from managed memory, which on CDNA needs
  XNACK on (``HSA_XNACK=1``), as AMD's sharing guide says.
* Other gfx9 parts (GCN5 Vega: gfx900, gfx906, the gfx90c APUs) support XNACK as well, so they
  are treated as CDNA is.

So a pool's ``deviceMemoryScaling`` above 1.0 scales only XNACK-capable GPUs; an RDNA GPU
registers its real VRAM and its pods get neither variable.
"""

from __future__ import annotations

RDNA_MIN_GFX = 100000
"""gfx_target_version from which a GPU is RDNA (gfx10+)."""
GFX9 = range(90000, 100000)
CDNA_TARGETS = frozenset({90008, 90010})
"""gfx908 and gfx90a; gfx94x and gfx95x are CDNA by their minor version (see is_cdna)."""


def is_rdna(gfx_target_version: int) -> bool:
    return gfx_target_version >= RDNA_MIN_GFX


def is_cdna(gfx_target_version: int) -> bool:
    return gfx_target_version in CDNA_TARGETS or 90400 <= gfx_target_version < 100000


def xnack_capable(gfx_target_version: int) -> bool:
    """GPU page-fault retry exists: every gfx9 part (GCN5 and CDNA); never RDNA. An unknown
    target (0) is not assumed capable."""
    return gfx_target_version in GFX9


def effective_memory_scaling(gfx_target_version: int, pool_scaling: float) -> float:
    """The pool's deviceMemoryScaling where the GPU can oversubscribe, else 1.0 (its real VRAM)."""
    return pool_scaling if xnack_capable(gfx_target_version) else 1.0
