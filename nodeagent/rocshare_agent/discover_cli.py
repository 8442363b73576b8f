"""Print the AMD GPUs (or compute partitions) found under a sysfs root.

Reads the KFD topology and amdgpu DRM folders under --sysfs-root (default /sys); with
--dev-root, a GPU whose device node there cannot be opened is shown unhealthy. --json prints
{"gpus": [...], "problems": [...]} (the per-GPU objects are the AmdGpuNode status entries);
otherwise a table. Product names come from the DRM folder, libdrm's amdgpu.ids
(/usr/share/libdrm/amdgpu.ids, or $ROCSHARE_AMDGPU_IDS) or rocshare's own table; the
NAME FROM column (productSource in JSON) says which. Exit status 0 even when some entries had problems (they are listed);
1 when no GPU was found.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rocshare.api.models import GpuInfo, OperatingMode

_COLUMNS = ("IDX", "ID", "PRODUCT", "NAME FROM", "GFX", "CUS", "VRAM MiB", "PCI", "NUMA", "PARTITION", "SPLIT", "HEALTH")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"), metavar="DIR", help="sysfs root (default /sys)")
    parser.add_argument("--dev-root", type=Path, default=None, metavar="DIR", help="device root for health checks, e.g. /dev")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--operating-mode", choices=[mode.value for mode in OperatingMode], default=OperatingMode.CU.value,
                        help="cu (default) or partition: partitions become whole, unshared devices")
    parser.add_argument("--split-count", type=int, default=0, metavar="N", help="pods per GPU; 0 = automatic (10, 2 on gfx12)")


def run(args: argparse.Namespace) -> int:
    from rocshare_agent.discovery import discover

    result = discover(args.sysfs_root, args.dev_root, operating_mode=OperatingMode(args.operating_mode),
                      split_count=args.split_count)
    if args.json:
        json.dump(result.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(result.gpus, result.product_sources))
        for problem in result.problems:
            sys.stdout.write(f"problem: {problem.path}: {problem.reason}\n")
    return 0 if result.gpus else 1


def _row(gpu: GpuInfo, source: str) -> tuple[str, ...]:
    partition = f"{gpu.partition.compute_mode}#{gpu.partition.index}" if gpu.partition else "-"
    return (str(gpu.index), gpu.id, gpu.product or "?", source or "?", str(gpu.gfx_target_version),
            str(gpu.cu_count),
            "?" if gpu.vram_mib is None else str(gpu.vram_mib), gpu.pci_bdf, "?" if gpu.numa is None else str(gpu.numa),
            partition, str(gpu.split_count), "ok" if gpu.healthy else f"UNHEALTHY ({gpu.health_reason})")


def format_table(gpus: list[GpuInfo], product_sources: dict[str, str] | None = None) -> str:
    rows = [_COLUMNS, *(_row(gpu, (product_sources or {}).get(gpu.id, "")) for gpu in gpus)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS) - 1)]
    lines = ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]) for row in rows]
    return "\n".join(lines) + "\n"
