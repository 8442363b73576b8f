"""`rocshare-dev bench placement`: arguments, policy selection and the JSON report.

The simulation lives in simulation.py and is imported in run(), so `--help` stays cheap.
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_NODES = "../shared/traces/openb/openb_node_list_gpu_node.csv"
DEFAULT_PODS = "../shared/traces/openb/openb_pod_list_default.csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="node list CSV (default: %(default)s)")
    parser.add_argument("--pods", default=DEFAULT_PODS, help="pod list CSV (default: %(default)s)")
    parser.add_argument(
        "--policy", default="best",
        help="a policy name, 'all', or 'best' (our recommended one); names: bestfit, binpack, spread, "
             "topology-aware, fgd, fragmentation-aware",
    )
    parser.add_argument("--seeds", default="42-51", type=parse_seeds, help="seeds: 42-51 or 42,43 (default: %(default)s)")
    parser.add_argument(
        "--ties", default="ordered", choices=("ordered", "random"),
        help="score ties: the first node in a fixed per-seed order, as the paper's simulator "
             "(default), or at random, as stock kube-scheduler",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report (default: a table)")


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            seeds.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seeds {text!r}: use 42-51 or 42,43") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds")
    return seeds


def policy_names(choice: str, known: list[str], best: str) -> list[str]:
    if choice == "all":
        return known
    if choice == "best":
        return [best]
    if choice not in known:
        raise ValueError(f"unknown policy {choice!r}; known: {', '.join(known)}, all, best")
    return [choice]


def run(args: argparse.Namespace) -> int:
    from rocshare_dev.bench import simulation as placement
    from rocshare_dev.bench.trace import load_nodes, load_pods

    try:
        names = policy_names(args.policy, list(placement.POLICIES), placement.BEST)
        nodes = [placement.build_inventory(n) for n in load_nodes(args.nodes)]
        pods = load_pods(args.pods)
    except (OSError, ValueError) as error:
        print(f"rocshare-dev bench placement: {error}", file=sys.stderr)
        return 2
    report: dict = {"nodes": args.nodes, "pods": args.pods, "seeds": args.seeds, "ties": args.ties, "policies": {}}
    if args.policy == "best":
        report["best"] = placement.BEST
    for name in names:
        report["policies"][name] = placement.run_policy(nodes, pods, name, args.seeds, args.ties)
        if not args.json:
            print(_row(name, report["policies"][name]), flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def _row(name: str, result: dict) -> str:
    ratio = result["allocation_ratio"]
    return (f"{name:20s} alloc@100 {ratio['100']['mean']:6.2f}  alloc@130 {ratio['130']['mean']:6.2f}  "
            f"frag@80 {result['fragmentation_ratio_80']:5.1f}  p99 {result['latency_ms']['p99']:.2f} ms "
            f"(CPU time {result['cpu_latency_ms']['p99']:.2f} ms)")
