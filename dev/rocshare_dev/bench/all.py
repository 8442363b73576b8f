"""`rocshare-dev bench all --out docs` (`make bench`): every benchmark of the report, one after another,
then docs/benchmarks.json (every figure, units in the key names, and the machine), a readable
docs/benchmarks.md (figure, value, target, met or missed by how much, command) and
docs/benchmarks-scaling.png (extender latency and operator memory at 100, 1,000, 5,000 nodes).

Sections: placement (bestfit and our best policy on the default openb trace, 3 seeds instead of
the paper's 10 to save time), layout (issue 41: the CU layouts Isolated and Packed on MI300X and MI210
shapes; allocation ratio and XCD / shader-engine sharing), extender, cost (operator and agent), hook (the memory hook's added
time per hipMalloc+hipFree pair, against the stub ROCm runtime), e2e (when the module
rocshare_dev.bench.e2e exists), dra (issues 31 and 42: create -> Running pods/s of DRA mode beside
extender mode and plain kube-scheduler on Kubernetes 1.37 and the CPU per pod by process, then the
openb replay's allocation ratio in extender mode and in DRA mode on the same nodes and pods), failover (issue 30: the leading operator replica stopped under a
stream of pods). Sections run one at a time: the machine is small. `--skip` leaves
sections out; their figures are kept from the previous report in --out if there is one (for e2e:
collected from the file `rocshare-dev bench e2e` writes), and the report marks them as carried over.
`--only` runs the sections named and keeps every other one from the previous report (e2e's too):
`rocshare-dev bench all --out docs --only dra` regenerates the dra section alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

SECTIONS = ("placement", "layout", "extender", "cost", "hook", "e2e", "dra", "failover")
PLACEMENT_SEEDS = "42-44"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="docs", help="folder for benchmarks.json/.md/-scaling.png (default: %(default)s)")
    parser.add_argument("--skip", default="", help=f"sections to leave out, comma-separated: {', '.join(SECTIONS)}")
    parser.add_argument("--only", default="", help="run only these sections, comma-separated; every other one "
                        "is kept from the previous report in --out")
    parser.add_argument("--seeds", default=PLACEMENT_SEEDS, help="placement seeds (default: %(default)s)")
    parser.add_argument("--hami-src", default=None,
                        help="a checkout of Project-HAMi/HAMi: the e2e section also runs HAMi's scheduler on the "
                             "same fleet (`make bench HAMI_SRC=<dir>`); without it the HAMi figures say \"not run\"")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: redraw benchmarks.md and the chart from benchmarks.json")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    only = {part.strip() for part in getattr(args, "only", "").split(",") if part.strip()}
    unknown = (skip | only) - set(SECTIONS)
    if unknown:
        print(f"rocshare-dev bench all: unknown sections {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
        return 2
    if only:
        skip |= set(SECTIONS) - only
    if args.render_only:
        report = json.loads((out / "benchmarks.json").read_text())
        (out / "benchmarks.md").write_text(render_markdown(report))
        draw_chart(report, out / "benchmarks-scaling.png")
        return 0
    previous = _previous(out / "benchmarks.json")
    sections: dict[str, dict] = {}
    for name in SECTIONS:
        if name == "e2e" and name in skip and not only and _e2e_saved() is not None:
            sections[name] = {"figures": _e2e_figures(_e2e_saved()), "carried_over": True}
            print("== e2e: skipped; figures collected from the last `rocshare-dev bench e2e` run")
            continue
        if name in skip:
            if name in previous:
                sections[name] = {**previous[name], "carried_over": True}
            print(f"== {name}: skipped" + (" (figures kept from the previous report)" if name in previous else ""))
            continue
        print(f"== {name}", flush=True)
        started = time.monotonic()
        sections[name] = RUNNERS[name](args)
        sections[name]["wall_s"] = round(time.monotonic() - started, 1)
    report = build_report(sections)
    (out / "benchmarks.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "benchmarks.md").write_text(render_markdown(report))
    draw_chart(report, out / "benchmarks-scaling.png")
    print(f"wrote {out / 'benchmarks.json'}, {out / 'benchmarks.md'}, {out / 'benchmarks-scaling.png'}")
    return 0


def _previous(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("sections", {})
    except (OSError, ValueError):
        return {}


# ---- sections --------------------------------------------------------------------------------


def _placement(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import simulation
    from rocshare_dev.bench.placement import DEFAULT_NODES, DEFAULT_PODS, parse_seeds
    from rocshare_dev.bench.trace import load_nodes, load_pods

    nodes = [simulation.build_inventory(n) for n in load_nodes(DEFAULT_NODES)]
    pods = load_pods(DEFAULT_PODS)
    seeds = parse_seeds(args.seeds)
    figures: dict = {}
    for label, policy in (("bestfit", "bestfit"), ("best", simulation.BEST)):
        result = simulation.run_policy(nodes, pods, policy, seeds)
        figures[f"placement_alloc_pct_at_130_{label}"] = result["allocation_ratio"]["130"]["mean"]
        figures[f"placement_alloc_pct_at_100_{label}"] = result["allocation_ratio"]["100"]["mean"]
        figures[f"placement_frag_pct_at_80_{label}"] = result["fragmentation_ratio_80"]
        figures[f"placement_decision_p99_ms_{label}"] = result["latency_ms"]["p99"]
        print(f"   {label} ({policy}): alloc@130 {figures[f'placement_alloc_pct_at_130_{label}']} %", flush=True)
    return {"figures": figures, "seeds": args.seeds, "best_policy": simulation.BEST}


def _layout(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import layout

    return layout_section(layout.measure())


def layout_section(report: dict) -> dict:
    """Issue 41: per shape (and the trace derived to whole-XCD sizes) and layout, the allocation ratio
    at 130 % and how many co-resident slices share an XCD (MI300X) or shader engine (MI210)."""
    figures: dict = {"layout_nodes": report["nodes"], "layout_gpus": report["gpus"]}
    for shape, by_layout in report["shapes"].items():
        for layout_name, result in by_layout.items():
            tag, unit = f"{shape}_{layout_name.lower()}", result["unit"].lower()
            figures[f"layout_alloc_pct_at_130_{tag}"] = result["allocation_ratio_130"]
            figures[f"layout_pairs_sharing_{unit}_pct_{tag}"] = result["pairs_sharing_unit_pct"]
            figures[f"layout_mean_tenants_per_{unit}_{tag}"] = result["mean_tenants_per_unit"]
            figures[f"layout_whole_{unit}_slices_sharing_pct_{tag}"] = result["whole_unit_slices_sharing_pct"]
        packed, isolated = by_layout["Packed"], by_layout["Isolated"]
        figures[f"layout_alloc_cost_pct_at_130_{shape}"] = round(
            packed["allocation_ratio_130"] - isolated["allocation_ratio_130"], 3)
    print(f"   mi300x: Isolated costs {figures.get('layout_alloc_cost_pct_at_130_mi300x')} points at 130 %; "
          f"whole-XCD slices sharing an XCD {figures.get('layout_whole_xcd_slices_sharing_pct_mi300x_xcd_sized_isolated')} %",
          flush=True)
    return {"figures": figures, "note": LAYOUT_NOTE}


LAYOUT_NOTE = (
    "The `layout_*` figures (issue 41, `dev/rocshare_dev/bench/layout.py`): the openb replay's node sample "
    "(--scale 0.25, seed 42) and arrival order, every GPU an MI300X in SPX mode (304 CUs, 8 XCDs) or an MI210 "
    "(104 CUs, 8 shader engines) with the trace's VRAM, placed by the allocator with the pool's CU layout "
    "Packed, then Isolated. `_xcd_sized` is the trace **derived**: every share rounded up to a multiple of 25 % "
    "(two whole XCDs of an MI300X), since the trace has no share of whole XCDs. Pairs sharing: of two pods "
    "pinning CUs of one GPU, the share that have an XCD (engine) in common, read by the bench's own table of the "
    "kernel's mapping (bit i on unit i mod 8). `layout_alloc_cost_pct_at_130_*` is Packed minus Isolated.")


def _extender(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import extender

    return extender_section(extender.measure(extender.NODE_COUNTS, extender.OCCUPANCIES, progress=True))


def extender_section(report: dict) -> dict:
    """Figures from `rocshare-dev bench extender --json`."""
    from rocshare_dev.bench import extender

    figures: dict = {}
    for setting in report["settings"]:
        nodes, pct = setting["nodes"], round(100 * setting["target_occupancy"])
        for kind in ("warm", "cold"):
            prefix = "extender" if kind == "warm" else "extender_cold"
            for stat in ("p50", "p99", "cpu_p99"):
                figures[f"{prefix}_{stat}_ms_{nodes}_nodes_{pct}pct"] = setting[kind][f"{stat}_ms"]
        figures[f"extender_occupancy_pct_{nodes}_nodes_{pct}pct"] = round(100 * setting["occupancy"], 1)
    for nodes in extender.NODE_COUNTS:  # the headline: the worse of the two occupancies
        for prefix in ("extender", "extender_cold"):
            for stat in ("p50", "p99", "cpu_p99"):
                figures[f"{prefix}_{stat}_ms_{nodes}_nodes"] = max(
                    figures[f"{prefix}_{stat}_ms_{nodes}_nodes_{round(100 * o)}pct"] for o in extender.OCCUPANCIES)
    return {"figures": figures, "detail": report}


def _cost(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import cost

    return cost_section(cost.measure(cost.FLEET_SIZES, progress=True))


def cost_section(report: dict) -> dict:
    """Figures from `rocshare-dev bench cost --json`."""
    figures: dict = {}
    for size in report.get("operator", {}).get("sizes", []):
        figures[f"operator_rss_mib_{size['nodes']}_nodes"] = size["rss_max_mib"]
        figures[f"operator_ready_s_{size['nodes']}_nodes"] = size["ready_s"]
    without = report.get("operator", {}).get("without_extender")
    if without:
        figures[f"operator_rss_mib_{without['nodes']}_nodes_without_extender"] = without["rss_max_mib"]
    agent = report.get("agent")
    if agent is None:
        return {"figures": figures, "detail": report}
    figures.update(agent_idle_rss_mib=agent["idle"]["rss_mib"], agent_idle_cpu_pct=agent["idle"]["cpu_pct"],
                   agent_burst_peak_rss_mib=agent["burst"]["peak_rss_mib"],
                   agent_burst_cpu_pct=agent["burst"]["cpu_pct"],
                   agent_burst_cpu_ms_per_pod=agent["burst"]["cpu_ms_per_pod"],
                   agent_burst_wall_s=agent["burst"]["wall_s"])
    return {"figures": figures, "detail": report}


def _hook(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import hook

    return hook.measure()


def _e2e(args: argparse.Namespace) -> dict:
    if importlib.util.find_spec("rocshare_dev.bench.e2e") is None:
        print("   skipped: rocshare_dev.bench.e2e does not exist yet (issue 10 item 2)")
        return {"figures": {}, "absent": True}
    from rocshare_dev.bench.e2e import run_e2e

    hami_src = Path(args.hami_src) if getattr(args, "hami_src", None) else None
    return {"figures": _e2e_figures(run_e2e(hami_src=hami_src))}


def _e2e_saved() -> dict | None:
    """The figures `rocshare-dev bench e2e` last wrote (its --json-out default), if any."""
    if importlib.util.find_spec("rocshare_dev.bench.e2e") is None:
        return None
    from rocshare_dev.bench.e2e import DEFAULT_JSON_OUT

    try:
        return json.loads(Path(DEFAULT_JSON_OUT).read_text())
    except (OSError, ValueError):
        return None


def _e2e_figures(result: dict) -> dict:
    figures = {key: value for key, value in result.items() if isinstance(value, int | float)}
    # HAMi's figures say "not run" without a checkout, and which commit was measured with one.
    figures.update({key: value for key, value in result.items()
                    if key.startswith("e2e_hami_") and isinstance(value, str) and key != "e2e_hami_bound_latency_note"})
    if figures.get("e2e_baseline_pods_per_s") and "e2e_pods_per_s" in figures:
        figures["e2e_throughput_ratio"] = round(figures["e2e_pods_per_s"] / figures["e2e_baseline_pods_per_s"], 3)
    return figures


def _dra(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench.dra import run_dra
    from rocshare_dev.bench.replay import real_modes

    figures = dra_figures(run_dra())
    replays = real_modes(scale=DRA_REPLAY_SCALE, seed=DRA_REPLAY_SEED)
    figures.update(dra_replay_figures(replays))
    return {"figures": figures, "note": DRA_NOTE}


DRA_REPLAY_SCALE = 0.25
DRA_REPLAY_SEED = 42
DRA_NOTE = (
    "The burst figures (`rocshare-dev bench dra`, Kubernetes 1.37.2): three bursts of the same pods on the same "
    "number of simulated nodes, one after another on one control plane, each timed from the first create to the "
    "last pod Running: DRA mode (each pod's claim from one ResourceClaimTemplate, the product's claim for "
    "`amd.com/gpu: 1, gpumem: 4096, gpucores: 25`; kube-scheduler's DRA plugin allocates; each node's rocshare "
    "agent, as a DRA driver, publishes the ResourceSlice and prepares the claim when the kubelet peer's DRA "
    "manager calls NodePrepareResources), plain kube-scheduler (`amd.com/gpu: 1` on a plain device plugin) and "
    "extender mode (the operator, its extender and webhooks, the agents' device plugin). `*_cpu_ms_per_bound_pod_"
    "<process>` is each process's CPU over the whole burst divided by its pods (every bound pod ran): where a "
    "mode's cost goes. The machine is shared by several engineers' sessions (2 cores): pods/s moves with what "
    "else ran (`dra_*cpu_s_other_users` in benchmarks.json says how much), CPU per pod much less. "
    "The `dra_replay_*` figures: the openb replay (`rocshare-dev bench replay`, default trace, "
    f"--scale {DRA_REPLAY_SCALE:g}, seed {DRA_REPLAY_SEED}: a quarter of the nodes, the simulator's arrival order "
    "to 130 % of their GPU capacity, one pod at a time, each decision awaited) played twice on the same nodes and "
    "pods: through rocshare's extender (pool policy fragmentation-aware, Kubernetes 1.35) and through DRA mode "
    "(Kubernetes 1.37, the pods' HAMi-style limits turned into claims by the admission webhook's translation, "
    "kube-scheduler with DRA mode's profile: the operator's extender scores the nodes with the same pool policy "
    "(prioritize-dra), the DRA allocator takes the first device of the node that fits). Allocation = GPU-milli of "
    "bound pods / the sample's capacity, read when arrivals pass 100 % and 130 %; `final` is the same from a "
    "fresh list at the end. `dra_replay_placement_lost_pct_at_130` is extender minus DRA: what DRA mode's "
    "placement costs. kube-scheduler breaks score ties at random, so DRA mode's ratio moves by a few tenths from run "
    "to run. --scale 0.25 keeps the section (three bursts and two replays) under 12 minutes on 2 cores.")


DRA_SUMMARY_PROCESSES = ("kube_scheduler", "kube_apiserver", "etcd", "kube_controller_manager", "kubelet_peer",
                         "agents", "operator")


def dra_summary_lines(figures: dict) -> list[str]:
    """The dra section's burst figures as one table: each mode's create -> Running and create ->
    bound pods/s and its CPU per pod, in all and by process."""
    if "dra_running_pods_per_s" not in figures:
        return []
    header = ["mode", "create → Running pods/s", "create → bound pods/s", "CPU ms/pod",
              *(name.replace("_", "-") for name in DRA_SUMMARY_PROCESSES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode, prefix in (("DRA", "dra_"), ("extender", "dra_extender_"), ("plain kube-scheduler", "dra_plain_")):
        row = [mode, figures.get(f"{prefix}running_pods_per_s"), figures.get(f"{prefix}bound_pods_per_s"),
               figures.get(f"{prefix}cpu_ms_per_bound_pod"),
               *(figures.get(f"{prefix}cpu_ms_per_bound_pod_{name}") for name in DRA_SUMMARY_PROCESSES)]
        lines.append("| " + " | ".join("—" if value is None else _shown(value) for value in row) + " |")
    return lines + ["", f"DRA against extender mode, create → Running: {figures.get('dra_to_extender_running_ratio')}×; "
                        f"against plain kube-scheduler: {figures.get('dra_to_plain_running_ratio')}× "
                        f"({figures.get('dra_nodes')} nodes, {figures.get('dra_pods')} pods per burst). "
                        f"The machine is shared: other processes took {figures.get('dra_cpu_s_other_users')} s of CPU "
                        f"during the DRA burst ({figures.get('dra_all_running_s')} s), "
                        f"{figures.get('dra_extender_cpu_s_other_users')} s during extender mode's "
                        f"({figures.get('dra_extender_all_running_s')} s) and "
                        f"{figures.get('dra_plain_cpu_s_other_users')} s during plain kube-scheduler's "
                        f"({figures.get('dra_plain_all_running_s')} s).", ""]


def dra_replay_figures(replays: dict) -> dict:
    """`real_modes`' report as figures: the ratios of both modes, the difference at 130 %, and
    what shows DRA mode's claims were really allocated."""
    figures: dict = {"dra_replay_scale": replays["scale"], "dra_replay_nodes": replays["nodes"],
                     "dra_replay_gpus": replays["gpus"], "dra_replay_pods": replays["pods_arrived"]}
    for mode in ("extender", "dra"):
        result = replays[mode]
        for point in ("100", "130"):
            figures[f"dra_replay_alloc_pct_at_{point}_{mode}"] = result["allocation_ratio"][point]
        figures[f"dra_replay_final_alloc_pct_{mode}"] = result["final_allocation_ratio"]
        figures[f"dra_replay_placed_pods_{mode}"] = result["placed"]
        figures[f"dra_replay_wall_s_{mode}"] = result["wall_s"]
    figures["dra_replay_allocated_claims_dra"] = replays["dra"]["allocated_claims"]
    figures["dra_replay_bound_gpu_pods_dra"] = replays["dra"]["bound_gpu_pods"]
    figures["dra_replay_placement_lost_pct_at_130"] = round(
        figures["dra_replay_alloc_pct_at_130_extender"] - figures["dra_replay_alloc_pct_at_130_dra"], 3)
    return figures


def dra_figures(result: dict) -> dict:
    """The numeric figures of `rocshare-dev bench dra` (the rest is its JSON's detail)."""
    return {key: value for key, value in result.items() if isinstance(value, int | float) and not isinstance(value, bool)}


def _failover(args: argparse.Namespace) -> dict:
    from rocshare_dev.bench import failover

    return {"figures": failover.measure()}


RUNNERS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "placement": _placement, "layout": _layout, "extender": _extender, "cost": _cost, "hook": _hook, "e2e": _e2e,
    "dra": _dra, "failover": _failover}


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    bound: float
    at_most: bool  # True: value <= bound; False: value >= bound


TARGETS: dict[str, Target] = {
    "extender_p99_ms_1000_nodes": Target(5.0, True),
    "extender_p99_ms_5000_nodes": Target(25.0, True),
    "operator_rss_mib_5000_nodes": Target(300.0, True),
    "e2e_pods_per_s": Target(100.0, False),
    "e2e_throughput_ratio": Target(0.5, False),
    "e2e_ratio_to_plain_scheduler": Target(0.6, False),  # issue 18
    "extender_cold_p99_ms_1000_nodes": Target(10.0, True),  # issue 18
    "extender_cold_p99_ms_5000_nodes": Target(50.0, True),
    "hook_added_p99_ns_stub": Target(1000.0, True),  # issue 29, against the stub runtime
    "failover_graceful_s": Target(2.0, True),  # issue 30
    "failover_sigkill_s": Target(10.0, True),
    "failover_pods_refused": Target(0, True),
    "failover_double_bookings": Target(0, True),
    "layout_alloc_cost_pct_at_130_mi300x": Target(0.3, True),  # issue 41: Isolated within 0.3 points of Packed
    "layout_whole_xcd_slices_sharing_pct_mi300x_xcd_sized_isolated": Target(1.0, True),  # near-perfect isolation
    "dra_to_extender_running_ratio": Target(1.0, False),  # issue 42: DRA create -> Running >= extender mode's
    "dra_replay_placement_lost_pct_at_130": Target(0.5, True),  # issue 42: within 0.5 points of extender mode
}

COMMANDS = {
    "placement": f"rocshare-dev bench placement --policy bestfit|best --seeds {PLACEMENT_SEEDS} --json",
    "layout": "rocshare-dev bench layout --json",
    "extender": "rocshare-dev bench extender --nodes 100,1000,5000 --occupancy 0.5,0.9",
    "cost": "rocshare-dev bench cost --nodes 100,1000,5000",
    "hook": "rocshare-dev bench hook (against the stub ROCm runtime)",
    "e2e": "rocshare-dev bench e2e --nodes 500 --pods 2000",
    "dra": ("rocshare-dev bench dra; "
            f"rocshare-dev bench replay --mode extender|dra --scale {DRA_REPLAY_SCALE:g}"),
    "failover": "rocshare-dev bench failover --trials 3 --rate 10",
}


def machine() -> dict:
    memory_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:"))
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "memory_gib": round(memory_kib / 1024**2, 1), "cpu": model,
            "python": platform.python_version(), "load_average_1m_at_end": round(os.getloadavg()[0], 2)}


def build_report(sections: dict[str, dict]) -> dict:
    figures: dict = {}
    for section in sections.values():
        figures.update(section.get("figures", {}))
    return {"generated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
            "figures": figures, "sections": sections}


def verdict(key: str, value: float) -> tuple[str, str]:
    """(target text, met/missed text) for a figure."""
    target = TARGETS.get(key)
    if target is None or not isinstance(value, int | float):
        return "—", "—"
    sign = "≤" if target.at_most else "≥"
    met = value <= target.bound if target.at_most else value >= target.bound
    if met:
        return f"{sign} {target.bound:g}", "met"
    gap = abs(value - target.bound)
    ratio = value / target.bound if target.at_most else target.bound / value if value else float("inf")
    return f"{sign} {target.bound:g}", f"**missed** by {gap:,.1f} ({ratio:.1f}×)"


def render_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# rocshare-dev benchmarks",
        "",
        f"Generated {report['generated']} by `make bench` (`rocshare-dev bench all --out docs`) on "
        f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}; "
        f"1-minute load average at the end {m['load_average_1m_at_end']} (the machine is shared: "
        "wall-clock latencies include time other processes held the cores; the `cpu_p99` figures do not).",
        "",
        "Units are in the key names (`_ms`, `_mib`, `_pct`, `_s`, `_per_s`). Every figure is in "
        "[benchmarks.json](benchmarks.json); the chart is [benchmarks-scaling.png](benchmarks-scaling.png).",
        "",
    ]
    lines += ["## Targets (issues 10, 18, 30, 41 and 42)", "", "| figure | value | target | met? |", "|---|---|---|---|"]
    for key in TARGETS:
        value = report["figures"].get(key)
        target, met = verdict(key, value) if value is not None else (verdict(key, 0)[0], "not measured")
        lines.append(f"| `{key}` | {'—' if value is None else _shown(value)} | {target} | {met} |")
    lines += ["", "Wall-clock latency on this shared machine includes waiting for a core; "
              "`extender_cpu_p99_ms_*` is the extender's own CPU time per pod (same rounds).", ""]
    for name in SECTIONS:
        section = report["sections"].get(name, {"figures": {}, "skipped": True})
        lines += _section_lines(name, section)
    lines += NOTES
    return "\n".join(lines) + "\n"


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _command(name: str, section: dict, key: str = "") -> str:
    """The command that produced figure `key` (the e2e and dra runs record their own scale)."""
    figures = section.get("figures", {})
    if key.startswith("dra_replay_"):
        mode = next((mode for mode in ("extender", "dra") if key.endswith(f"_{mode}")), "extender|dra")
        return (f"rocshare-dev bench replay --mode {mode} --scale {figures.get('dra_replay_scale', DRA_REPLAY_SCALE):g}"
                f" --seed {DRA_REPLAY_SEED}")
    if name == "e2e" and "e2e_nodes" in figures:
        return f"rocshare-dev bench e2e --nodes {figures['e2e_nodes']:g} --pods {figures['e2e_pods']:g}"
    if name == "dra" and "dra_nodes" in figures:
        return f"rocshare-dev bench dra --nodes {figures['dra_nodes']:g} --pods {figures['dra_pods']:g}"
    return COMMANDS[name]


def _section_lines(name: str, section: dict) -> list[str]:
    title = {"placement": "Placement (FGD protocol, openb default trace)",
             "layout": "CU layout: Isolated against Packed (issue 41; openb trace on MI300X and MI210 shapes)", "extender": "Extender decision latency",
             "cost": "Operator and agent cost", "e2e": "End to end on the real control plane",
             "dra": "DRA mode beside extender mode and plain kube-scheduler (create -> Running and CPU per pod, "
                    "Kubernetes 1.37; openb replay allocation ratios)",
             "hook": "Memory hook cost (against the stub ROCm runtime)",
             "failover": "Failover of the leading operator replica"}[name]
    lines = [f"## {title}", ""]
    if section.get("absent"):
        return lines + ["Not measured: `rocshare_dev.bench.e2e` does not exist yet.", ""]
    if section.get("skipped"):
        return lines + [f"Not measured in this report: skipped, and no earlier figures to carry over "
                        f"(run `{COMMANDS[name]}`).", ""]
    if section.get("carried_over"):
        lines += ["*Carried over: this section was skipped in the last `bench all` run; the figures are from "
                  "an earlier run of its own command.*", ""]
    if name == "dra":
        lines += dra_summary_lines(section.get("figures", {}))
    lines += ["| figure | value | target | met? | command |", "|---|---|---|---|---|"]
    for key, value in section.get("figures", {}).items():
        target, met = verdict(key, value)
        lines.append(f"| `{key}` | {_shown(value)} | {target} | {met} | `{_command(name, section, key)}` |")
    if section.get("note"):
        lines += ["", section["note"]]
    if section.get("wall_s"):
        lines += ["", f"Section wall time: {section['wall_s']:.0f} s."]
    return lines + [""]


NOTES = [
    "## How these were measured",
    "",
    "* **Extender** (`dev/rocshare_dev/bench/extender.py`): a SchedulerState built in memory through the "
    "informer handlers, N nodes × 8 GPUs from the MI210 and MI300X captures (MI300X folded from its CPX "
    "capture to 8 GPUs of 304 CUs; VRAM is **synthetic**, 64 and 192 GiB: the captures have none), filled "
    "with allocator-made records. One round = filter over the **full** node list (the profile's "
    "percentageOfNodesToScore is 100: kube-scheduler sends every node that passed its own filters), "
    "keeping the nodes the policy ranks best (the shipped profile calls no prioritize) + the bind decision "
    "(parse, node_rejection, allocate, record and HAMi annotation encoding; no HTTP). `extender_p99_ms_N_nodes` "
    "is the worse of 50 % and 90 % occupancy, warm: pods drawn from a 7-shape mix after one untimed pod of "
    "each shape, a pod committed and an older one released after each round, then the plan refresher's "
    "turn (as between kube-scheduler's calls: each recently asked shape plans the changed nodes; its CPU "
    "per pod is `refresh_cpu_mean_ms`, not in the decision figures; `--no-refresh` measures without it). "
    "`extender_cold_*` empties the plan memo before each round (the first pod of a never-seen shape).",
    "* **Operator** (`dev/rocshare_dev/bench/cost.py`): real etcd + kube-apiserver + controller-manager; "
    "N Nodes, N AmdGpuNodes with status, 4 bound pods per node with allocation records (no webhook, no "
    "kube-scheduler), then `rocshare operator --standalone --no-webhook`; RSS (VmRSS, max over 20 s after "
    "/readyz) from /proc. The process holds one watch per kind for Nodes, Pods, AmdGpuNodes and "
    "ResourceQuotas (small facts, no bodies) shared by the extender and the reconcilers, the extender's "
    "caches, and Kopf's watches on pools, shares and DaemonSets.",
    "* **Agent**: one simulated node (kubelet peer + `rocshare agent`, health every 2 s) on the MI210 "
    "capture with synthetic 64 GiB VRAM and splitCount 25; idle over 30 s; burst: 200 pods bound one at a "
    "time (the extender's in-flight gate) until all Running and marked allocated. CPU from /proc/<pid>/stat.",
    "* **Failover** (`dev/rocshare_dev/bench/failover.py`): two operator replicas, each with its own "
    "kube-scheduler on the shipped Lease timings (6 s / 4 s / 0.5 s), two simulated MI210 nodes, 10 slice pods "
    "a second (each deleted 2 s after it runs); the leader stopped 3 times per kind while the stream goes on. "
    "`failover_<kind>_s` is the worst time from the stop to the next pod bound once the old leader's "
    "kube-scheduler has exited; "
    "refused counts refused creations and Failed pods; double bookings are checked from what the kubelet "
    "peer handed each container.",
    "* **Placement**: 3 seeds (42–44) instead of the 10 of docs/placement.md, for time.",
    "",
]


# ---- chart -----------------------------------------------------------------------------------


def draw_chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figures = report["figures"]
    sizes = (100, 1000, 5000)
    fig, (latency, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for occupancy, color in ((50, "tab:blue"), (90, "tab:orange")):
        for stat, line in (("p99", "o-"), ("p50", "o--")):
            points = [(n, figures.get(f"extender_{stat}_ms_{n}_nodes_{occupancy}pct")) for n in sizes]
            points = [(n, v) for n, v in points if v is not None]
            if points:
                latency.plot(*zip(*points), line, color=color, label=f"{stat}, {occupancy} % occupancy")
    cpu = [(n, max((figures.get(f"extender_cpu_p99_ms_{n}_nodes_{o}pct") or 0) for o in (50, 90))) for n in sizes]
    cpu = [(n, v) for n, v in cpu if v]
    if cpu:  # the wall-clock tail on a shared machine includes waiting for a core; CPU time does not
        latency.plot(*zip(*cpu), "k:", marker="^", label="CPU-time p99 (worse occupancy)")
    latency.plot([1000, 5000], [5, 25], "r*", markersize=12, label="p99 targets")
    latency.set(xscale="log", yscale="log", xlabel="nodes (8 GPUs each)", ylabel="ms per pod (wall clock)",
                title="Extender: filter (best nodes) + bind decision")
    latency.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    rss = [(n, figures.get(f"operator_rss_mib_{n}_nodes")) for n in sizes]
    rss = [(n, v) for n, v in rss if v is not None]
    if rss:
        memory.plot(*zip(*rss), "o-", color="tab:green", label="operator RSS (4 pods per node)")
    memory.axhline(300, color="r", linestyle="--", label="target at 5,000 nodes")
    memory.set(xscale="log", xlabel="nodes (8 GPUs each)", ylabel="MiB", title="Operator resident memory")
    for axis in (latency, memory):
        axis.set_xticks(sizes, [f"{n:,}" for n in sizes])
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(f"rocshare cost by cluster size — {report['machine']['cores']} cores, "
                 f"{report['machine']['memory_gib']} GiB", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
