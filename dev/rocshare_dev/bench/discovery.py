"""`rocshare-dev bench discovery`: how long discovery of a sysfs tree takes (target: < 100 ms
for the 63-partition MI300X capture, issue 4)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rocshare_agent.discovery import discover


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", type=Path, required=True, metavar="DIR", help="sysfs tree to discover")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs (default 50)")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(bench_discovery(args.sysfs_root, args.repeats)))
    return 0


def bench_discovery(sysfs_root: Path, repeats: int = 50) -> dict:
    """Time `discover(sysfs_root)`: the figure for the < 100 ms target."""
    timings_ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = discover(Path(sysfs_root))
        timings_ms.append((time.perf_counter() - started) * 1000)
    timings_ms.sort()
    return {"sysfs_root": str(sysfs_root), "gpus": len(result.gpus), "repeats": repeats,
            "min_ms": round(timings_ms[0], 2), "median_ms": round(timings_ms[len(timings_ms) // 2], 2),
            "p95_ms": round(timings_ms[int(len(timings_ms) * 0.95) - 1 if repeats >= 20 else -1], 2),
            "max_ms": round(timings_ms[-1], 2)}

