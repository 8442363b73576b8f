"""Marketing names of AMD GPUs, and where each name came from.

The source of truth is libdrm's `amdgpu.ids` (Debian package `libdrm-common`,
/usr/share/libdrm/amdgpu.ids; ROCm ships a copy under /opt/amdgpu/share/libdrm/): lines
`<device id>,\\t<revision id>,\\t<product name>`, hex ids. `load_amdgpu_ids` is the only I/O
here; `product_name` is pure. The order of sources, first match wins:

1. the DRM folder's `product_name` (Instinct boards fill it; Radeon boards leave it empty);
2. amdgpu.ids by device and revision id;
3. amdgpu.ids by device id alone, when every revision of that id has the same name
   (KFD-only captures and partitions carry no revision);
4. rocshare's built-in table below: boards that older amdgpu.ids files lack (Debian 12 ships
   libdrm 2.4.114, without MI300X, RX 7900 or Strix Point; Debian 13's 2.4.124 has the MI300A and
   MI300X but no MI308X, MI325X or their HF/VF variants), keyed by device id and, where one
   id covers several products, by revision or CU count, as the newer amdgpu.ids names them;
5. amdgpu.ids by device id, several names: all of them, joined with " / ";
6. nothing known: "AMD GPU <device id> (<gfx target>)".

`ProductName.source` says which one applied, so a surprising name can be traced.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

AMDGPU_IDS_ENV = "ROCSHARE_AMDGPU_IDS"
AMDGPU_IDS_PATHS = (Path("/usr/share/libdrm/amdgpu.ids"), Path("/opt/amdgpu/share/libdrm/amdgpu.ids"))

SOURCE_DRM = "drm-product-name"
SOURCE_IDS = "amdgpu.ids"
SOURCE_IDS_DEVICE = "amdgpu.ids-device-id"
SOURCE_BUILTIN = "rocshare-table"
SOURCE_IDS_AMBIGUOUS = "amdgpu.ids-ambiguous"
SOURCE_GENERIC = "generic"

AmdgpuIds = Mapping[int, Mapping[int, str]]
"""device id -> revision id -> product name."""


@dataclass(frozen=True)
class ProductName:
    name: str
    source: str


@dataclass(frozen=True)
class _Builtin:
    device_id: int
    name: str
    revision: int | None = None
    cu_count: int | None = None


# Names as the current amdgpu.ids spells them (mesa/drm data/amdgpu.ids); CU counts from AMD's
# product pages, used only where the revision is unknown and one device id has several products.
BUILTIN: tuple[_Builtin, ...] = (
    _Builtin(0x6860, "AMD Radeon Instinct MI25", cu_count=64),
    _Builtin(0x66A1, "AMD Radeon Instinct MI50", cu_count=60),
    _Builtin(0x66A1, "AMD Radeon Instinct MI60", cu_count=64),
    _Builtin(0x738C, "AMD Instinct MI100"),
    _Builtin(0x7408, "AMD Instinct MI250X"),
    _Builtin(0x740C, "AMD Instinct MI250X / MI250"),
    _Builtin(0x740F, "AMD Instinct MI210"),
    # The MI300 series (gfx942) and MI350 series (gfx950): one product per device id, revision 00.
    # HF and VF are the high-frequency and SR-IOV virtual-function parts. 0x74B9 and 0x74BC are
    # from AMD's own node labeller (ROCm/k8s-device-plugin), ahead of libdrm.
    _Builtin(0x74A0, "AMD Instinct MI300A"),
    _Builtin(0x74A1, "AMD Instinct MI300X"),
    _Builtin(0x74A2, "AMD Instinct MI308X"),
    _Builtin(0x74A5, "AMD Instinct MI325X"),
    _Builtin(0x74A8, "AMD Instinct MI308X HF"),
    _Builtin(0x74A9, "AMD Instinct MI300X HF"),
    _Builtin(0x74B5, "AMD Instinct MI300X VF"),
    _Builtin(0x74B6, "AMD Instinct MI308X"),
    _Builtin(0x74B9, "AMD Instinct MI325X VF"),
    _Builtin(0x74BC, "AMD Instinct MI308X HF VF"),
    _Builtin(0x74BD, "AMD Instinct MI300X HF"),
    _Builtin(0x75A0, "AMD Instinct MI350X"),
    _Builtin(0x75A3, "AMD Instinct MI355X"),
    _Builtin(0x75B0, "AMD Instinct MI350X VF"),
    _Builtin(0x75B3, "AMD Instinct MI355X VF"),
    _Builtin(0x744C, "AMD Radeon RX 7900 XTX", revision=0xC8, cu_count=96),
    _Builtin(0x744C, "AMD Radeon RX 7900 XT", revision=0xCC, cu_count=84),
    _Builtin(0x744C, "AMD Radeon RX 7900 GRE", revision=0xCE, cu_count=80),
    _Builtin(0x744C, "AMD Radeon RX 7900M", revision=0xCF, cu_count=72),
    _Builtin(0x150E, "AMD Radeon 880M Graphics", revision=0xC4, cu_count=12),
    _Builtin(0x150E, "AMD Radeon 890M Graphics", revision=0xC1, cu_count=16),
    _Builtin(0x7550, "AMD Radeon RX 9070 XT", revision=0xC0, cu_count=64),
    _Builtin(0x7550, "AMD Radeon RX 9070", revision=0xC3, cu_count=56),
)


def parse_amdgpu_ids(text: str) -> dict[int, dict[int, str]]:
    """The table in an amdgpu.ids file; comments, the version line and malformed lines are skipped."""
    table: dict[int, dict[int, str]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split(",", 2)
        if len(parts) != 3:
            continue  # blank lines and the "1.0.0" version line
        try:
            device_id, revision = int(parts[0].strip(), 16), int(parts[1].strip(), 16)
        except ValueError:
            continue
        name = parts[2].strip()
        if name:
            table.setdefault(device_id, {})[revision] = name
    return table


def amdgpu_ids_paths() -> tuple[Path, ...]:
    """Where to look: $ROCSHARE_AMDGPU_IDS alone when set, else the usual places."""
    override = os.environ.get(AMDGPU_IDS_ENV)
    return (Path(override),) if override else AMDGPU_IDS_PATHS


@lru_cache(maxsize=4)
def load_amdgpu_ids(paths: tuple[Path, ...]) -> tuple[AmdgpuIds, Path | None]:
    """The first readable amdgpu.ids of `paths`, read once per process; ({}, None) if none."""
    for path in paths:
        try:
            return parse_amdgpu_ids(path.read_text(encoding="utf-8", errors="replace")), path
        except OSError:
            continue
    return {}, None


def product_name(*, device_id: int, revision: int | None = None, cu_count: int | None = None,
                 drm_name: str = "", ids: AmdgpuIds, gfx: str = "") -> ProductName:
    if drm_name.strip():
        return ProductName(drm_name.strip(), SOURCE_DRM)
    revisions = ids.get(device_id, {})
    if revision is not None and revision in revisions:
        return ProductName(revisions[revision], SOURCE_IDS)
    names = sorted(set(revisions.values()))
    if len(names) == 1:
        return ProductName(names[0], SOURCE_IDS_DEVICE)
    builtin = _builtin(device_id, revision, cu_count)
    if builtin is not None:
        return ProductName(builtin, SOURCE_BUILTIN)
    if names:
        return ProductName(" / ".join(names), SOURCE_IDS_AMBIGUOUS)
    family = " / ".join(sorted({row.name for row in BUILTIN if row.device_id == device_id}))
    if family:
        return ProductName(family, SOURCE_BUILTIN)
    suffix = f" ({gfx})" if gfx else ""
    return ProductName(f"AMD GPU {device_id:04x}{suffix}", SOURCE_GENERIC)


def _builtin(device_id: int, revision: int | None, cu_count: int | None) -> str | None:
    rows = [row for row in BUILTIN if row.device_id == device_id]
    for row in rows:
        if revision is not None and row.revision == revision:
            return row.name
    matching = [row for row in rows if row.cu_count is None or row.cu_count == cu_count]
    return matching[0].name if len(matching) == 1 else None
