"""`rocshare-dev bench replay`: the openb trace through the real pipeline, next to the simulator.

The FGD paper's protocol (../shared/traces/openb/README.md, bench/simulation.py) played through
the real kube-apiserver, kube-scheduler (the manifests' profile) and rocshare's extender, onto
simulated nodes (the kubelet's device manager, `kubelet-peer`, and rocshare's agents, many per
process), and, on the same node subset and pod sequence, through the simulator; both allocation
ratios side by side at 100 % and 130 % of arrived demand.

* Nodes: a proportional sample of the trace's node list (`--scale`, per GPU model, so the model
  mix is kept; seeded). Each node carries the trace's CPU and memory (kube-scheduler fits them
  itself) and GPU count. GPUs come from the MI210 capture (../shared/fixtures/sysfs) with
  synthetic sizes: 100 CUs per GPU and the trace model's VRAM (simulation.MODEL_VRAM_MIB), so
  the shares below are exact; see devcluster/captures.mi210_resized.
* Pods: the simulator's arrival order for `--seed` (the whole trace shuffled, then drawn until
  130 % of the subset's GPU capacity), one at a time: each is created and its decision (bound,
  or Pending with kube-scheduler's and the extender's reason) awaited before the next. A share
  of m milli (m < 1000) asks `amd.com/gpu: 1`, `amd.com/gpucores: m/10` and
  `amd.com/gpumem-percentage: m/10`; m = 1000 asks `amd.com/gpu: num_gpu` (whole GPUs); every
  pod requests its trace CPU and memory. CPU-only pods use rocshare's scheduler too; the profile
  sends every pod to the extender (no managedResources), so the pool's policy ranks them as the
  simulator does. Pods that fit nowhere stay Pending.
* Real policies are what an AmdGpuPool can say (REAL_POLICIES); the simulator also runs the
  paper's policies (bestfit, fgd) and ours (fragmentation-aware) on the same subset and sequence,
  with the paper's tie rule, its typical workload and node CPU in every score.

`--mode dra` runs the real half through DRA mode instead (replay_dra.py): the same nodes and pods,
kube-scheduler's DRA allocator on Kubernetes 1.37, no extender; the simulator columns are as above.

Figures: allocation ratio = allocated GPU-milli / subset capacity, read when arrivals pass 100 %
and 130 % (as simulation.run_seed); the real one from the pods' own decisions, checked at the end
against a fresh list of the pods. A chart of allocation against arrived demand goes to docs/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rocshare_dev.bench import replay_cluster, replay_dra
from rocshare_dev.bench.placement import DEFAULT_NODES, DEFAULT_PODS
from rocshare_dev.bench.replay_common import CU_COUNT, Outcome
from rocshare_dev.bench.trace import TraceNode, TracePod, load_nodes, load_pods

REAL_POLICIES: dict[str, dict[str, str]] = {
    "fragmentation-aware": {"gpuPolicy": "fragmentation-aware"},
    "bestfit": {"nodePolicy": "bestfit", "gpuPolicy": "binpack"},
    "binpack": {"nodePolicy": "binpack", "gpuPolicy": "binpack"},
    "spread": {"nodePolicy": "spread", "gpuPolicy": "spread"},
    "topology-aware": {"nodePolicy": "binpack", "gpuPolicy": "topology-aware"},
}
"""--policy -> the pool's spec.scheduling. fgd is a simulator policy only: an AmdGpuPool's
fragmentation-aware GPU policy implies rocshare's node scorer (rocshare.core.policies.Policy)."""
SIMULATED = ("bestfit", "fragmentation-aware", "fgd")
MODES = ("extender", "dra")
CLI_MODES = (*MODES, "dra-unscored")
"""dra-unscored: DRA mode with the plain profile and no extender (DRA mode before issue 42's node scores)."""
DEFAULT_CHART = "docs/replay-{policy}.png"
RAW_OUT = Path(__file__).resolve().parents[3] / ".cache" / "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="node list CSV (default: %(default)s)")
    parser.add_argument("--pods", default=DEFAULT_PODS, help="pod list CSV (default: %(default)s)")
    parser.add_argument("--scale", type=float, default=0.25, help="share of the nodes, per GPU model (default: %(default)s)")
    parser.add_argument("--policy", default="fragmentation-aware",
                        help=f"the pool's policy for the real run: {', '.join(REAL_POLICIES)} (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=42, help="arrival order and node sample (default: %(default)s)")
    parser.add_argument("--mode", choices=CLI_MODES, default="extender",
                        help="the real run: rocshare's extender (default), DRA mode (kube-scheduler's DRA allocator "
                             "picks the device, Kubernetes 1.37; the node is scored by the extender with --policy; "
                             "replay_dra.py) or dra-unscored (DRA mode with a plain profile, no extender)")
    parser.add_argument("--simulate-only", action="store_true", help="run the simulator only (no cluster)")
    parser.add_argument("--twins", action="store_true",
                        help="also simulate the pipeline as the extender decided before it tracked host CPU "
                             "(simulated_as_extender) and as it decides now, tracking host CPU and ranking GPU-less "
                             "pods (simulated_as_extender_host_cpu), and the policy's node with the GPUs DRA's "
                             "allocator takes, first fit in slice order (simulated_first_fit_devices); ~2 min more "
                             "at --scale 0.25")
    parser.add_argument("--decision-timeout-s", type=float, default=120.0, help="per pod (default: %(default)s)")
    parser.add_argument("--chart", default=DEFAULT_CHART, help="chart path ('' for none; default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for the cluster (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) afterwards")
    parser.add_argument("--json", action="store_true", help="print the JSON report (default: a table)")


def run(args: argparse.Namespace) -> int:
    if args.policy not in REAL_POLICIES:
        print(f"rocshare-dev bench replay: --policy {args.policy!r} is not a pool policy; an AmdGpuPool says "
              f"{', '.join(REAL_POLICIES)} (fgd runs in the simulator columns)", file=sys.stderr)
        return 2
    try:
        subset = sample_nodes(load_nodes(args.nodes), args.scale, args.seed)
        pods = load_pods(args.pods)
    except (OSError, ValueError) as error:
        print(f"rocshare-dev bench replay: {error}", file=sys.stderr)
        return 2
    report = replay(subset, pods, policy=args.policy, seed=args.seed, real=not args.simulate_only, twins=args.twins,
                    decision_timeout_s=args.decision_timeout_s, work_dir=args.work_dir, keep=args.keep, mode=args.mode)
    report.update({"nodes_csv": args.nodes, "pods_csv": args.pods, "scale": args.scale})
    label = args.policy if args.mode == "extender" else args.mode
    full = RAW_OUT / f"replay-{label}-{args.scale}-{args.seed}.json"  # curves and per-pod choices
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(json.dumps(report) + "\n")
    if args.chart:
        chart = Path(args.chart.format(policy=label))
        draw_chart(report, chart)
        report["chart"] = str(chart)
    print(json.dumps(_without_curves(report), indent=2) if args.json else table(report))
    return 0


# ---- the node sample and the pod sequence ----------------------------------------------------


def sample_nodes(nodes: Sequence[TraceNode], scale: float, seed: int) -> list[TraceNode]:
    """round(scale x count) nodes of each GPU model, drawn with `seed`, in the list's order."""
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], not {scale}")
    by_model: dict[str, list[int]] = defaultdict(list)
    for position, node in enumerate(nodes):
        by_model[node.model].append(position)
    rng = random.Random(seed)
    chosen: set[int] = set()
    for model in sorted(by_model):
        positions = by_model[model]
        chosen.update(rng.sample(positions, round(scale * len(positions))))
    return [node for position, node in enumerate(nodes) if position in chosen]


# ---- the simulator on the same subset and sequence ------------------------------------------


def simulate(subset: Sequence[TraceNode], sequence: Sequence[TracePod], all_pods: Sequence[TracePod],
             policy: str, seed: int) -> dict[str, Any]:
    from rocshare.core.fragmentation import FragmentationModel
    from rocshare_dev.bench import simulation as sim

    inventories = [sim.build_inventory(node) for node in subset]
    capacity = sum(len(node.gpus) for node in inventories) * 1000
    model = FragmentationModel(sim.typical_workload(all_pods))
    cluster = sim.Cluster(sim.node_order(inventories, seed), sim.POLICIES[policy], sim.scoring_context(inventories, model))
    outcome = Outcome(capacity)
    started = time.perf_counter()
    for serial, pod in enumerate(sequence):
        request = sim.pod_request(pod, serial)
        chosen = cluster.decide(request, None)
        if chosen is not None:
            cluster.bind(chosen, request)
        outcome.add(pod, None if chosen is None else str(cluster.nodes[chosen].name))
    return {"policy": policy, **outcome.summary(), "wall_s": round(time.perf_counter() - started, 1),
            "what": "simulator (bench/simulation.py): the paper's tie rule, typical workload and node CPU in every score"}


def simulate_device_choice(subset: Sequence[TraceNode], sequence: Sequence[TracePod], all_pods: Sequence[TracePod],
                           policy: str, seed: int) -> dict[str, Any]:
    """`simulate` with the node chosen by `policy` but the devices by DRA's allocator: on the chosen
    node, the first GPUs in the order the node publishes them (its ResourceSlice: GPU index order)
    on which the pod's share fits, whatever `policy`'s GPU rule would pick. Against `simulate`, the
    difference is what first fit on the device costs once the node choice is the policy's."""
    from dataclasses import replace

    from rocshare.core.allocate import Plan, plan_pod
    from rocshare.core.fragmentation import FragmentationModel
    from rocshare.core.request import PodRequest, Selection
    from rocshare_dev.bench import simulation as sim

    inventories = [sim.build_inventory(node) for node in subset]
    model = FragmentationModel(sim.typical_workload(all_pods))
    cluster = sim.Cluster(sim.node_order(inventories, seed), sim.POLICIES[policy], sim.scoring_context(inventories, model))
    outcome = Outcome(sum(len(node.gpus) for node in inventories) * 1000)

    def first_fit(i: int, request: PodRequest) -> Plan:
        node, usage = cluster.nodes[i], cluster.usages[i]
        one = replace(request, containers=tuple(replace(c, gpus=min(c.gpus, 1)) for c in request.containers))
        wanted = max(c.gpus for c in request.containers)
        fitting = [gpu.gpu_id for gpu in node.gpus
                   if isinstance(plan_pod(node, usage, replace(one, selection=Selection(use_uuids=frozenset({gpu.gpu_id}))),
                                          cluster.policy, cluster.ctx), Plan)]
        plan = plan_pod(node, usage, replace(request, selection=Selection(use_uuids=frozenset(fitting[:wanted]))),
                        cluster.policy, cluster.ctx)
        assert isinstance(plan, Plan), (node.name, request, fitting)
        return plan

    for serial, pod in enumerate(sequence):
        request = sim.pod_request(pod, serial)
        chosen = cluster.decide(request, None)
        if chosen is not None:
            cluster.bind(chosen, request, first_fit(chosen, request) if request.wants_gpus else None)
        outcome.add(pod, None if chosen is None else str(cluster.nodes[chosen].name))
    return {"policy": policy, **outcome.summary(),
            "what": "simulator, node chosen by the policy, GPUs by first fit in index order (DRA's allocator)"}


def simulate_as_extender(subset: Sequence[TraceNode], sequence: Sequence[TracePod], policy: str,
                         seed: int, *, host_cpu: bool = False) -> dict[str, Any]:
    """The simulator configured as the pipeline decides, to tell the pipeline's own faithfulness
    from what the extender models differently: the pool's learnt model (WorkloadWindow fed each
    bound pod, as the pod feed does); exact ties to the node with the most CPU and memory used
    (NodeResourcesFit MostAllocated), then the first in the seed's node order.
    `host_cpu` True is the extender as it is (host CPU tracked, GPU-less pods ranked by the policy);
    False is the extender before it tracked host CPU: GPU pods scored with no host CPU and
    GPU-less pods placed by MostAllocated alone."""
    from dataclasses import replace

    from rocshare.core.allocate import Plan, plan_pod, record_from_plan
    from rocshare.core.ids import PodKey
    from rocshare.core.ledger import Ledger
    from rocshare.core.policies import ScoringContext
    from rocshare.core.workload import WorkloadWindow
    from rocshare_dev.bench import simulation as sim

    full = sim.node_order([sim.build_inventory(node) for node in subset], seed)
    bare = full if host_cpu else [replace(node, cpu_milli=0, memory_mib=0) for node in full]
    ledger, window = Ledger(), WorkloadWindow()
    cpu, mem = [0] * len(full), [0] * len(full)
    outcome = Outcome(sum(len(node.gpus) for node in full) * 1000)
    started = time.perf_counter()
    memo: dict[tuple, Any] = {}  # (node shape, loads, request shape, model) -> plan: nodes alike plan alike
    ctx = ScoringContext(fragmentation=window.model())
    for serial, pod in enumerate(sequence):
        request = sim.pod_request(pod, serial)
        if window.model() is not ctx.fragmentation:
            ctx, memo = ScoringContext(fragmentation=window.model()), {}

        def packed(i: int) -> float:
            return (cpu[i] + request.cpu_milli) / full[i].cpu_milli + (mem[i] + request.memory_mib) / full[i].memory_mib

        best: tuple | None = None
        for i, node in enumerate(bare):
            if cpu[i] + request.cpu_milli > full[i].cpu_milli or mem[i] + request.memory_mib > full[i].memory_mib:
                continue
            plan = None
            if request.wants_gpus or host_cpu:
                usage = ledger.usage(node)
                key = (node.shape, usage.loads, usage.cpu_milli, usage.memory_mib, request.gpu_key,
                       request.cpu_milli, request.memory_mib)
                plan = memo.get(key, memo)
                if plan is memo:
                    plan = memo[key] = plan_pod(node, usage, request, sim.POLICIES[policy], ctx)
            if (request.wants_gpus or host_cpu) and not isinstance(plan, Plan):
                continue
            rank = (plan.score if plan is not None else 0.0, packed(i), -i)
            if best is None or rank > best[0]:
                best = (rank, i, plan)
        chosen = None
        if best is not None:
            _, i, plan = best
            key = PodKey(f"{request.namespace}/{request.name}")
            cpu_held = {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib} if host_cpu else {}
            if request.wants_gpus:
                record = record_from_plan(bare[i], ledger.usage(bare[i]), request, plan)
                ledger.apply(record, key, **cpu_held)
                window.add((request.cpu_milli if host_cpu else 0, pod.num_gpu,
                            max(10, min(1000, round(pod.gpu_milli / 10) * 10)), ()))
            elif host_cpu:
                ledger.add_host(bare[i].name, key, **cpu_held)
                window.add((request.cpu_milli, 0, 0, ()))
            cpu[i] += request.cpu_milli
            mem[i] += request.memory_mib
            chosen = str(full[i].name)
        outcome.add(pod, chosen)
    return {"policy": policy, **outcome.summary(), "wall_s": round(time.perf_counter() - started, 1),
            "what": ("simulator as the extender decides: host CPU tracked, the learnt model, GPU-less pods ranked "
                     "by the policy, MostAllocated for ties" if host_cpu else
                     "simulator as the extender decided before it tracked host CPU: no host CPU in GPU scores, the "
                     "learnt model, MostAllocated for ties and GPU-less pods")}


def sequence_for(subset: Sequence[TraceNode], pods: Sequence[TracePod], seed: int) -> list[TracePod]:
    """The simulator's arrival order for the subset's capacity, cut where the next pod would push
    requested GPU past 130 % of it: on a sample of the nodes, the shuffled trace alone already
    asks more than that, and the paper stops arriving there."""
    from rocshare_dev.bench.simulation import ARRIVAL_LIMIT, arrivals

    capacity = sum(node.gpus for node in subset) * 1000
    sequence: list[TracePod] = []
    requested = 0
    for pod in arrivals(pods, seed, capacity):
        if requested + pod.gpu_milli_total > ARRIVAL_LIMIT * capacity:
            break
        sequence.append(pod)
        requested += pod.gpu_milli_total
    return sequence


# ---- the report ------------------------------------------------------------------------------


def replay(subset: Sequence[TraceNode], pods: Sequence[TracePod], *, policy: str, seed: int, real: bool = True,
           twins: bool = False, decision_timeout_s: float = 120.0, work_dir: Path | None = None, keep: bool = False,
           mode: str = "extender") -> dict[str, Any]:
    sequence = sequence_for(subset, pods, seed)
    report: dict[str, Any] = {
        "seed": seed, "policy": policy, "mode": mode, "nodes": len(subset), "gpus": sum(node.gpus for node in subset),
        "gpu_models": dict(Counter(node.model for node in subset)), "pods_arrived": len(sequence),
        "setup": {
            "gpus": f"MI210 capture, synthetic sizes: {CU_COUNT} CUs, the trace model's VRAM",
            "shares": "gpu_milli m < 1000 -> amd.com/gpu 1, gpucores m/10, gpumem-percentage m/10; "
                      "m = 1000 -> amd.com/gpu num_gpu; cpu and memory requested as in the trace",
            "pool": {"scheduling": REAL_POLICIES[policy]},
        },
    }
    for name in dict.fromkeys((policy, *SIMULATED)):
        if name in SIMULATED or name == policy:
            result = simulate(subset, sequence, pods, name, seed)
            report[f"simulated_{name.replace('-', '_')}"] = result
    report["simulated"] = report[f"simulated_{policy.replace('-', '_')}"]
    if twins:
        report["simulated_as_extender"] = simulate_as_extender(subset, sequence, policy, seed)
        report["simulated_as_extender_host_cpu"] = simulate_as_extender(subset, sequence, policy, seed, host_cpu=True)
        report["simulated_first_fit_devices"] = simulate_device_choice(subset, sequence, pods, policy, seed)
    if real:
        report["real"] = run_real(subset, sequence, policy=policy, scheduling=REAL_POLICIES[policy],
                                  decision_timeout_s=decision_timeout_s, work_dir=work_dir, keep=keep, mode=mode)
        real_130 = report["real"]["allocation_ratio"]["130"]
        report["real_minus_simulated_130"] = round(real_130 - report["simulated"]["allocation_ratio"]["130"], 3)
        report["real_minus_simulated_fgd_130"] = round(real_130 - report["simulated_fgd"]["allocation_ratio"]["130"], 3)
    return report


def real_modes(*, scale: float, seed: int, policy: str = "fragmentation-aware",
               decision_timeout_s: float = 120.0) -> dict[str, Any]:
    """The real run in both modes, one after the other, on the same node sample and pod sequence
    of the default trace (`make bench`'s dra section): {"extender": ..., "dra": ...} and the sample."""
    subset = sample_nodes(load_nodes(DEFAULT_NODES), scale, seed)
    sequence = sequence_for(subset, load_pods(DEFAULT_PODS), seed)
    report: dict[str, Any] = {"scale": scale, "seed": seed, "policy": policy, "nodes": len(subset),
                              "gpus": sum(node.gpus for node in subset), "pods_arrived": len(sequence)}
    for mode in MODES:
        print(f"   replay, {mode} mode: {len(subset)} nodes, {len(sequence)} pods", flush=True)
        report[mode] = run_real(subset, sequence, policy=policy, scheduling=REAL_POLICIES[policy],
                                decision_timeout_s=decision_timeout_s, work_dir=None, keep=False, mode=mode)
    full = RAW_OUT / f"replay-modes-{scale}-{seed}.json"  # curves, per-pod choices, pending reasons
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(json.dumps(report) + "\n")
    return report


def run_real(subset: Sequence[TraceNode], sequence: Sequence[TracePod], *, policy: str, scheduling: dict[str, str],
             decision_timeout_s: float, work_dir: Path | None, keep: bool, mode: str = "extender") -> dict[str, Any]:
    """The real run in `mode`: "extender" (replay_cluster.run_extender) or "dra" (replay_dra.run_dra:
    DRA mode on a 1.37 control plane, the same nodes and pods); the same figures either way."""
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="rocshare-replay-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM too stops what the run started
    try:
        if mode in ("dra", "dra-unscored"):
            result = asyncio.run(replay_dra.run_dra(root, subset, sequence, decision_timeout_s,
                                                    scheduling if mode == "dra" else None))
            what = replay_dra.WHAT if mode == "dra" else replay_dra.WHAT_UNSCORED
        else:
            result = asyncio.run(replay_cluster.run_extender(root, subset, sequence, scheduling, decision_timeout_s))
            what = replay_cluster.WHAT
    except BaseException:
        print(f"rocshare-dev bench replay: failed; logs kept in {root}", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    result.update({"policy": policy, "mode": mode, "wall_s": round(time.monotonic() - started, 1), "what": what})
    return result


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _without_curves(report: dict[str, Any]) -> dict[str, Any]:
    return {key: ({k: v for k, v in value.items() if k not in ("curve", "choices")} if isinstance(value, dict) else value)
            for key, value in report.items()}


def table(report: dict[str, Any]) -> str:
    lines = [f"openb replay: {report['nodes']} nodes, {report['gpus']} GPUs, {report['pods_arrived']} pods, "
             f"seed {report['seed']}", f"{'':44s} alloc@100  alloc@130  placed/failed"]
    real = f"real pipeline ({report['policy']})" if report.get("mode", "extender") == "extender" else "real DRA mode"
    rows = [(real, report.get("real"))]
    rows += [(f"simulator ({name})", report[f"simulated_{name.replace('-', '_')}"])
             for name in dict.fromkeys((report["policy"], *SIMULATED))]
    rows += [("simulator as the extender decided (no host CPU)", report.get("simulated_as_extender")),
             ("simulator as the extender decides now", report.get("simulated_as_extender_host_cpu")),
             ("simulator, the policy's node, first-fit GPUs (DRA)", report.get("simulated_first_fit_devices"))]
    for label, result in rows:
        if result:
            ratio = result["allocation_ratio"]
            lines.append(f"{label:44s} {ratio['100']:8.2f}  {ratio['130']:9.2f}  {result['placed']}/{result['failed']}")
    if report.get("real"):
        lines.append(f"real run: {report['real']['wall_s']:.0f} s in all, replay {report['real']['replay_s']:.0f} s")
    return "\n".join(lines)


def draw_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    series = []
    if report.get("real"):
        real = f"real pipeline: {report['policy']}" if report.get("mode", "extender") == "extender" else "real DRA mode"
        series.append((real, report["real"], "-", 2.2))
    for name in dict.fromkeys((report["policy"], *SIMULATED)):
        series.append((f"simulator: {name}", report[f"simulated_{name.replace('-', '_')}"], "--", 1.2))
    for key, label in (("simulated_as_extender", "simulator as the extender decided (no host CPU)"),
                       ("simulated_as_extender_host_cpu", "simulator as the extender decides now")):
        if report.get(key):
            series.append((label, report[key], ":", 1.2))
    for label, result, style, width in series:
        xs, ys = zip(*result["curve"]) if result["curve"] else ((), ())
        axes.plot(xs, ys, style, linewidth=width, label=f"{label} ({result['allocation_ratio']['130']:.2f} @130 %)")
    axes.plot([0, 100], [0, 100], ":", color="grey", linewidth=0.8)
    axes.set_xlabel("arrived GPU demand, % of capacity")
    axes.set_ylabel("allocated GPU, % of capacity")
    axes.set_xlim(60, 131)
    axes.set_ylim(60, 100)
    axes.grid(alpha=0.3)
    axes.set_title(f"openb default, {report['nodes']} nodes / {report['gpus']} GPUs, seed {report['seed']}")
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
