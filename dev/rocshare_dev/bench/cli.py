"""Benchmarks. `rocshare-dev bench placement ...` replays the FGD paper's protocol on the
Alibaba openb trace through rocshare's allocator (see docs/placement.md). Each benchmark is
a module with add_arguments(parser) and run(args) -> int, listed in BENCHMARKS."""

from __future__ import annotations

import argparse
import importlib

# name -> (module, one-line help). Add a benchmark by adding a module and a line here.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "placement": ("rocshare_dev.bench.placement",
                  "replay a trace with the FGD paper's protocol; allocation ratios per policy"),
    "replay": ("rocshare_dev.bench.replay",
               "the openb trace through the real kube-scheduler and extender onto simulated nodes, next to the simulator"),
    "layout": ("rocshare_dev.bench.layout",
               "the openb trace on MI300X/MI210-shaped GPUs, CU layout Packed vs Isolated: allocation ratio and "
               "how many co-resident slices share an XCD / shader engine"),
    "allocate": ("rocshare_dev.bench.allocate", "device plugin Allocate latency for a burst of pods on one node (p99 target 20 ms)"),
    "extender": ("rocshare_dev.bench.extender",
                 "extender filter (best nodes) + bind decision latency at 100-5,000 nodes (p99 5 ms at 1,000)"),
    "e2e": ("rocshare_dev.bench.e2e",
            "pods/s from create to Running on the real control plane, rocshare vs kube-scheduler alone"),
    "dra": ("rocshare_dev.bench.dra",
            "create -> bound pods/s on Kubernetes 1.37: DRA mode (kube-scheduler's DRA allocator on the product's "
            "ResourceSlices) beside extender mode and plain kube-scheduler"),
    "floor": ("rocshare_dev.bench.floor",
              "bench e2e's ceiling: rocshare's admission, profile and extender protocol with an extender that "
              "decides nothing, against plain kube-scheduler"),
    "cost": ("rocshare_dev.bench.cost",
             "operator RSS with 100-5,000 nodes and 4 pods each; agent CPU and RSS idle and in a 200-pod burst"),
    "failover": ("rocshare_dev.bench.failover",
                 "kill the leading operator replica (SIGKILL, graceful) under a stream of slice pods: time to the "
                 "next bind, pods refused, double bookings from what containers received"),
    "all": ("rocshare_dev.bench.all",
            "every benchmark of the report -> docs/benchmarks.json, .md and -scaling.png (make bench)"),
    "hook": ("rocshare_dev.bench.hook",
             "time the in-container memory hook adds to a hipMalloc+hipFree pair, against the stub runtime (p99 goal 1 us)"),
    "discovery": ("rocshare_dev.bench.discovery", "time GPU discovery of a sysfs tree (target < 100 ms on the MI300X CPX capture)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, (module_name, summary) in BENCHMARKS.items():
        sub = benches.add_parser(name, help=summary, description=summary)
        sub.set_defaults(_bench_module=module_name)
        importlib.import_module(module_name).add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._bench_module).run(args) or 0)
