"""Benchmarks. `rocshare bench placement ...` replays the FGD paper's protocol on the
Alibaba openb trace through rocshare's allocator (see docs/placement.md). Each benchmark is
a module with add_arguments(parser) and run(args) -> int, listed in BENCHMARKS."""

from __future__ import annotations

import argparse
import importlib

# name -> (module, one-line help). Add a benchmark by adding a module and a line here.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "placement": ("rocshare.bench.placement",
                  "replay a trace with the FGD paper's protocol; allocation ratios per policy"),
    "allocate": ("rocshare_agent.deviceplugin.bench", "device plugin Allocate latency for a burst of pods on one node (p99 target 20 ms)"),
    "discovery": ("rocshare_agent.discovery.bench", "time GPU discovery of a sysfs tree (target < 100 ms on the MI300X CPX capture)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, (module_name, summary) in BENCHMARKS.items():
        sub = benches.add_parser(name, help=summary, description=summary)
        sub.set_defaults(_bench_module=module_name)
        importlib.import_module(module_name).add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._bench_module).run(args) or 0)
