"""The operator with faults planted, for chaos tests (harness only; the product never imports it).

    python -m rocshare_dev.devcluster.faults [--choke-facts PREFIX] [--raise PREFIX:TIMES] -- operator ...

runs `rocshare` (the arguments after ``--``) in this process after patching:
* ``--choke-facts PREFIX``: the pod fact decoder (``cluster_facts._pod_facts``) raises on every
  pod whose name starts with PREFIX -- a pod object the operator cannot read;
* ``--raise PREFIX:TIMES``: the extender's accounting of pod events (``Accounts.on_pod``)
  raises on the first TIMES events of each pod whose name starts with PREFIX -- a handler that
  fails and must be retried.
Each planted fault logs a line with ``planted fault`` so tests can tell it fired.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Sequence

log = logging.getLogger("rocshare_dev.faults")


class PlantedFault(RuntimeError):
    """Raised where a test asked for a failure."""


def choke_facts(prefix: str) -> None:
    from rocshare_operator.feed import cluster_facts

    real = cluster_facts._pod_facts

    def choking(pod):
        name = ((pod.get("metadata") or {}).get("name") or "") if isinstance(pod, dict) else ""
        if name.startswith(prefix):
            log.warning("planted fault: the fact decoder chokes on pod %s", name)
            raise PlantedFault(f"planted: cannot read pod {name}")
        return real(pod)

    cluster_facts._pod_facts = choking


def raise_on_events(prefix: str, times: int) -> None:
    from rocshare_operator.extender.accounts import Accounts

    real = Accounts.on_pod
    raised: Counter[str] = Counter()

    def failing(self, kind, pod):
        if pod.name.startswith(prefix) and raised[pod.key] < times:
            raised[pod.key] += 1
            log.warning("planted fault: accounting raises on %s %s (%d of %d)", kind, pod.key, raised[pod.key], times)
            raise PlantedFault(f"planted: accounting failed on {pod.key}")
        return real(self, kind, pod)

    Accounts.on_pod = failing


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="rocshare_dev.devcluster.faults")
    parser.add_argument("--choke-facts", default=None)
    parser.add_argument("--raise", dest="raise_", default=None, help="PREFIX:TIMES")
    args = parser.parse_args(argv[:split])
    if args.choke_facts:
        choke_facts(args.choke_facts)
    if args.raise_:
        prefix, _, times = args.raise_.rpartition(":")
        raise_on_events(prefix, int(times))
    from rocshare.cli import main as rocshare_main

    return rocshare_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
