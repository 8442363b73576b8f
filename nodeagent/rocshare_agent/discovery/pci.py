"""Small lookup tables for what sysfs does not say: GPU families and gfx targets
(product names are in names.py). Families follow
the amdgpu family names AMD's node labeller publishes (AI, NV, GC_11_0_0, ...), derived from
the gfx target version. Kernels before gfx_target_version was exported (Vega10 capture)
get it from a few well-known device ids.
"""

from __future__ import annotations

# gfx target versions for device ids of kernels that predate the gfx_target_version property.
LEGACY_GFX_TARGETS: dict[int, int] = {
    **{device_id: 90000 for device_id in range(0x6860, 0x6870)},  # Vega10 = gfx900
    **{device_id: 90006 for device_id in range(0x66A0, 0x66B0)},  # Vega20 = gfx906
    0x738C: 90008, 0x738E: 90008,  # Arcturus = gfx908
}

RDNA_MIN_GFX_TARGET = 100000
GFX12_RANGE = range(120000, 130000)


def gfx_target_for(gfx_target_version: int, device_id: int) -> int:
    return gfx_target_version or LEGACY_GFX_TARGETS.get(device_id, 0)


def gfx_name(gfx_target_version: int) -> str:
    """90402 -> gfx942, 110000 -> gfx1100, 90010 -> gfx90a (minor and stepping in hex)."""
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def cu_per_wgp(gfx_target_version: int) -> int:
    """RDNA (gfx10+) groups CUs in pairs (workgroup processors); CDNA/GCN do not."""
    return 2 if gfx_target_version >= RDNA_MIN_GFX_TARGET else 1


def family(gfx_target_version: int) -> str:
    """The amdgpu family name (as in the kernel's AMDGPU_FAMILY_*), or "" when unknown."""
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if major == 11:
        if minor == 0:
            return "GC_11_0_1" if stepping == 3 else "GC_11_0_0"
        return f"GC_11_{minor}_0"
    return {7: "CI", 8: "VI", 9: "AI", 10: "NV", 12: "GC_12_0_0"}.get(major, "")
