"""`rocshare-dev`: the harness's one entry point (benchmarks, the local control plane, the demo, the docs).

The product's own command is `rocshare`; this one is installed only with the dev extras.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rocshare_dev.bench import cli as bench_cli


def _passthrough(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the command (see its --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocshare-dev", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = commands.add_parser("bench", help="run a benchmark: placement on a trace, extender latency, e2e, ...")
    bench_cli.add_arguments(bench)
    _passthrough(commands.add_parser("cluster", help="the local control plane: up | down", add_help=False))
    _passthrough(commands.add_parser("real-node", help="a real kubelet + containerd node in its own netns: up | down",
                                     add_help=False))
    _passthrough(commands.add_parser("chart", help="write charts/rocshare from manifests/ (--check: fail when stale)",
                                     add_help=False))
    _passthrough(commands.add_parser("docs", help="docs reference: write docs/reference/*.md from the code (--check)",
                                     add_help=False))
    _passthrough(commands.add_parser("demo", help="make demo: control plane, operator, simulated fleet, samples: up | down",
                                     add_help=False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return int(bench_cli.run(args) or 0)
    if args.command == "chart":
        from rocshare_dev.chart import main as chart_main
        return chart_main(args.rest)
    if args.command == "docs":
        from rocshare_dev.docsgen import main as docs_main
        return docs_main(args.rest)
    if args.command == "cluster":
        from rocshare_dev.devcluster.__main__ import main as cluster_main
        return cluster_main(args.rest)
    if args.command == "real-node":
        from rocshare_dev.realnode.__main__ import main as real_node_main
        return real_node_main(args.rest)
    from rocshare_dev.devcluster.demo import main as demo_main
    return demo_main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
