"""`rocshare bench discovery`: how long discovery of a sysfs tree takes (target: < 100 ms
for the 63-partition MI300X capture, issue 4)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rocshare_agent.discovery import bench_discovery


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", type=Path, required=True, metavar="DIR", help="sysfs tree to discover")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs (default 50)")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(bench_discovery(args.sysfs_root, args.repeats)))
    return 0
