"""The `rocshare` command: one entry point, a subcommand per part of the product.

Each subcommand has a small CLI module providing ``add_arguments(parser)`` and
``run(args) -> int``. They are imported here by name, so the import contracts see every
edge; each imports its heavy dependencies (Kopf, grpc) inside ``run``, so `rocshare discover`
does not pay for Kopf and `--help` stays fast. Benchmarks and the dev cluster are not part of
the product: they are `rocshare-dev` (installed with the dev extras, see dev/).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from rocshare.api import crds_cli
from rocshare_agent import cli as agent_cli
from rocshare_agent import discover_cli
from rocshare_operator import cli as operator_cli

# name -> (module, one-line help). The module's docstring is the long help.
SUBCOMMANDS: dict[str, tuple[ModuleType, str]] = {
    "operator": (operator_cli, "run the operator: pool/share/node reconcilers, scheduler extender, admission webhook"),
    "agent": (agent_cli, "run the node agent: discovery, health, inventory publishing, device plugin, monitor"),
    "discover": (discover_cli, "print the AMD GPUs found under a sysfs root (table or --json)"),
    "crds": (crds_cli, "write the CustomResourceDefinitions generated from the API models"),
}


def build_parser(prog: str = "rocshare", subcommands: dict[str, tuple[ModuleType, str]] | None = None,
                 description: str = "rocshare shares AMD GPUs between Kubernetes pods. "
                                    "Each subcommand has its own --help.") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, summary) in (SUBCOMMANDS if subcommands is None else subcommands).items():
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.set_defaults(_module=module)
        if module.__doc__:
            sub.description = module.__doc__.strip()
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
        module.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
