"""`rocshare-dev bench layout`: what the Isolated CU layout costs and what it buys (issue 41).

The openb trace's protocol (bench/simulation.py, the replay's node sample and arrival order,
bench/replay.py) through rocshare's own allocator, no control plane: every trace GPU becomes a
GPU of the chosen shape with its kernel topology (rocshare.core.cu_topology), laid out once
Packed and once Isolated; everything else (nodes, pods, policy, seed) is the same.

* ``mi300x``: an MI300X in SPX mode, 304 CUs over 8 XCDs of 38 (4 engines each);
* ``mi210``: an MI210, 104 CUs over 8 shader engines of 13.

VRAM is the trace model's, so memory fits as in the paper. A share of m milli asks
``amd.com/gpucores`` and ``amd.com/gpumem-percentage`` of m/10. The trace has no share of a
whole number of XCDs (its shares are 81 %, 47 %, 32 % ...), so a second workload, **derived**
from it, rounds every share up to the next multiple of 25 % (250 milli: 76 CUs, two whole XCDs of
an MI300X) and everything else as the trace: ``xcd_sized``. Its figures show what Isolated does
for slices the hardware can isolate.

Figures, read when arrivals pass 130 % of capacity:

* allocation ratio (allocated GPU-milli / capacity) per layout;
* the isolation unit is the XCD on the MI300X and the shader engine on the MI210. Over the GPUs'
  co-resident slice pairs (two pods pinning CUs of one GPU), the share of pairs that have a unit in
  common; the mean tenants per unit in use; and, for slices whose CU count is a whole number of
  units (25 %, 50 %, 75 % of an MI300X), the share that have a unit in common with another tenant.

Which unit a mask bit is on is worked out here from the kernel's mapping as the bench's own table
(MI300X SPX: bit i on XCD i mod 8; MI210: bit i on engine i mod 8), not by the product's rule.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from itertools import combinations
from typing import Any

from rocshare_dev.bench.placement import DEFAULT_NODES, DEFAULT_PODS

SHAPES: dict[str, dict[str, Any]] = {
    "mi300x": {"cu_count": 304, "gfx": 90402, "unit": "XCD", "units": 8, "unit_cus": 38,
               "kfd": dict(num_xcc=8, array_count=4, simd_arrays_per_engine=1, cu_per_simd_array=10)},
    "mi210": {"cu_count": 104, "gfx": 90010, "unit": "SE", "units": 8, "unit_cus": 13,
              "kfd": dict(num_xcc=1, array_count=8, simd_arrays_per_engine=1, cu_per_simd_array=14)},
}
LAYOUTS = ("Packed", "Isolated")
DEFAULT_SCALE = 0.25
DEFAULT_SEED = 42
POLICY = "fragmentation-aware"


def unit_of(shape: str, bit: int) -> int:
    """The bench's own table: both shapes deal bits round-robin over 8 units (XCDs, engines)."""
    return bit % SHAPES[shape]["units"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="node list CSV (default: %(default)s)")
    parser.add_argument("--pods", default=DEFAULT_PODS, help="pod list CSV (default: %(default)s)")
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE, help="share of the nodes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="arrival order and node sample (default: %(default)s)")
    parser.add_argument("--shapes", default="mi300x,mi210", help="GPU shapes: mi300x, mi210 (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the JSON report (default: a table)")


def run(args: argparse.Namespace) -> int:
    report = measure(nodes_csv=args.nodes, pods_csv=args.pods, scale=args.scale, seed=args.seed,
                     shapes=[s.strip() for s in args.shapes.split(",") if s.strip()])
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for shape, by_layout in report["shapes"].items():
            for layout, result in by_layout.items():
                print(f"{shape:7} {layout:9} alloc@130 {result['allocation_ratio_130']:7.3f} %  "
                      f"pairs sharing a {result['unit']} {result['pairs_sharing_unit_pct']:6.2f} %  "
                      f"tenants/{result['unit']} {result['mean_tenants_per_unit']:.2f}  "
                      f"whole-unit slices sharing {result['whole_unit_slices_sharing_pct']:6.2f} % "
                      f"({result['whole_unit_slices']})")
    return 0


def measure(*, nodes_csv: str = DEFAULT_NODES, pods_csv: str = DEFAULT_PODS, scale: float = DEFAULT_SCALE,
            seed: int = DEFAULT_SEED, shapes: list[str] | None = None) -> dict[str, Any]:
    from rocshare_dev.bench.replay import sample_nodes, sequence_for
    from rocshare_dev.bench.trace import load_nodes, load_pods

    subset = sample_nodes(load_nodes(nodes_csv), scale, seed)
    pods = load_pods(pods_csv)
    sequence = sequence_for(subset, pods, seed)
    report: dict[str, Any] = {"scale": scale, "seed": seed, "policy": POLICY, "nodes": len(subset),
                              "gpus": sum(node.gpus for node in subset), "pods_arrived": len(sequence), "shapes": {}}
    xcd_pods = [xcd_sized(pod) for pod in pods]
    xcd_sequence = sequence_for(subset, xcd_pods, seed)
    for shape in shapes or list(SHAPES):
        report["shapes"][shape] = {layout: run_layout(subset, sequence, pods, seed, shape, layout)
                                   for layout in LAYOUTS}
        report["shapes"][f"{shape}_xcd_sized"] = {
            layout: run_layout(subset, xcd_sequence, xcd_pods, seed, shape, layout) for layout in LAYOUTS}
    return report


XCD_SIZED_MILLI = 250


def xcd_sized(pod):
    """The trace pod with its share rounded up to a multiple of 25 % (a whole GPU stays whole)."""
    from dataclasses import replace

    if not pod.num_gpu or pod.gpu_milli >= 1000:
        return pod
    return replace(pod, gpu_milli=-(-pod.gpu_milli // XCD_SIZED_MILLI) * XCD_SIZED_MILLI)


def run_layout(subset, sequence, all_pods, seed: int, shape: str, layout: str) -> dict[str, Any]:
    from rocshare.core.fragmentation import FragmentationModel
    from rocshare_dev.bench import simulation as sim
    from rocshare_dev.bench.replay import Outcome

    inventories = [inventory(node, shape, layout) for node in subset]
    model = FragmentationModel(sim.typical_workload(all_pods))
    cluster = sim.Cluster(sim.node_order(inventories, seed), sim.POLICIES[POLICY],
                          sim.scoring_context(inventories, model))
    outcome = Outcome(sum(len(node.gpus) for node in inventories) * 1000)
    isolation: dict[str, Any] | None = None
    started = time.perf_counter()
    for serial, pod in enumerate(sequence):
        request = sim.pod_request(pod, serial)
        chosen = cluster.decide(request, None)
        if chosen is not None:
            cluster.bind(chosen, request)
        outcome.add(pod, None if chosen is None else str(cluster.nodes[chosen].name))
        if isolation is None and "130" in outcome.ratios:
            isolation = isolation_figures(cluster.ledger.records().values(), shape)
    if isolation is None:
        isolation = isolation_figures(cluster.ledger.records().values(), shape)
    summary = outcome.summary()
    return {"allocation_ratio_130": summary["allocation_ratio"]["130"],
            "allocation_ratio_100": summary["allocation_ratio"]["100"],
            "placed": summary["placed"], "wall_s": round(time.perf_counter() - started, 1), **isolation}


def inventory(node, shape: str, layout: str):
    from rocshare.api.models import CuLayout
    from rocshare.core.cu_topology import CuTopology
    from rocshare.core.ids import GpuId, NodeName
    from rocshare.core.inventory import GpuSpec, NodeInventory
    from rocshare_dev.bench.simulation import DEFAULT_VRAM_MIB, MODEL_VRAM_MIB

    found = SHAPES[shape]
    topology = CuTopology.from_kfd(**found["kfd"], cu_count=found["cu_count"], gfx_target_version=found["gfx"])
    vram = MODEL_VRAM_MIB.get(node.model, DEFAULT_VRAM_MIB)
    gpus = tuple(GpuSpec(gpu_id=GpuId(f"{node.name}/gpu{i}"), index=i, memory_mib=vram, cu_count=found["cu_count"],
                         product=node.model, gfx_target_version=found["gfx"], topology=topology,
                         cu_layout=CuLayout(layout))
                 for i in range(node.gpus))
    return NodeInventory(NodeName(node.name), gpus, cpu_milli=node.cpu_milli, memory_mib=node.memory_mib)


def isolation_figures(records, shape: str) -> dict[str, Any]:
    """Co-residence per GPU from the allocation records: which units each pod's pinned CUs touch."""
    found = SHAPES[shape]
    tenants: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))  # gpu -> pod -> bits
    for serial, record in enumerate(records):
        for container in record.containers:
            for device in container.devices:
                for low, high in device.cu_ranges:
                    tenants[device.gpu_id][str(serial)].update(range(low, high + 1))
    pairs = sharing_pairs = 0
    unit_tenants: list[int] = []
    whole = whole_sharing = 0
    for pods in tenants.values():
        units = {pod: {unit_of(shape, bit) for bit in bits} for pod, bits in pods.items()}
        for a, b in combinations(sorted(units), 2):
            pairs += 1
            sharing_pairs += bool(units[a] & units[b])
        per_unit: dict[int, int] = defaultdict(int)
        for touched in units.values():
            for unit in touched:
                per_unit[unit] += 1
        unit_tenants.extend(per_unit.values())
        for pod, bits in pods.items():
            if len(bits) % found["unit_cus"] == 0:
                whole += 1
                whole_sharing += any(per_unit[unit] > 1 for unit in units[pod])
    return {"unit": found["unit"], "co_resident_pairs": pairs,
            "pairs_sharing_unit_pct": round(100.0 * sharing_pairs / pairs, 2) if pairs else 0.0,
            "mean_tenants_per_unit": round(sum(unit_tenants) / len(unit_tenants), 3) if unit_tenants else 0.0,
            "whole_unit_slices": whole,
            "whole_unit_slices_sharing_pct": round(100.0 * whole_sharing / whole, 2) if whole else 0.0}
