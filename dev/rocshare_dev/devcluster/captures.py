"""The real sysfs captures in ../shared/fixtures/sysfs, and the one synthetic change the
simulated fleets need: the MI210 capture is KFD topology only and carries no VRAM size, so
`mi210_with_synthetic_vram` copies it and gives each GPU node a 64 GiB frame-buffer bank
(mem_banks/0, heap_type 1), as the MI210 has. Everything that uses the copy says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT

FIXTURES = (PROJECT_ROOT / ".." / "shared" / "fixtures" / "sysfs").resolve()
MI210_VRAM_BYTES = 64 * 1024**3


def mi210_with_synthetic_vram(fixtures: Path, into: Path) -> Path:
    target = into / "mi210-synthetic-vram"
    if target.exists():
        return target
    shutil.copytree(fixtures / "mi210-8gpu-xgmi", target, symlinks=True)
    for node in (target / "class" / "kfd" / "kfd" / "topology" / "nodes").iterdir():
        properties = (node / "properties").read_text()
        if "simd_count" not in properties or "simd_count 0" in properties:
            continue  # a CPU node
        bank = node / "mem_banks" / "0"
        bank.mkdir(parents=True, exist_ok=True)
        (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {MI210_VRAM_BYTES}\nflags 0\nwidth 4096\n")
    return target
