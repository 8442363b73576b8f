"""The `rocshare` command: one entry point, a subcommand per part.

Each subcommand has a small CLI module providing ``add_arguments(parser)`` and
``run(args) -> int``. Those modules import their heavy dependencies (Kopf, grpc)
inside ``run``, so `rocshare discover` does not pay for Kopf and `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). The module's docstring is the long help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("rocshare_operator.cli", "run the operator: pool/share/node reconcilers, scheduler extender, admission webhook"),
    "agent": ("rocshare_agent.cli", "run the node agent: discovery, health, inventory publishing, device plugin, monitor"),
    "discover": ("rocshare_agent.discover_cli", "print the AMD GPUs found under a sysfs root (table or --json)"),
    "bench": ("rocshare.bench.cli", "run a benchmark: placement on a trace, extender latency, ..."),
    "crds": ("rocshare.api.crds_cli", "write the CustomResourceDefinitions generated from the API models"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocshare",
        description="rocshare shares AMD GPUs between Kubernetes pods. Each subcommand has its own --help.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.set_defaults(_module=module_name)
        _module_arguments(module_name, sub)
    return parser


def _module_arguments(module_name: str, sub: argparse.ArgumentParser) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            sub.description = f"{sub.description} (not available in this build: {module_name} missing)"
            return
        raise
    if module.__doc__:
        sub.description = module.__doc__.strip()
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
    module.add_arguments(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
