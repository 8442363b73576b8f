"""The operator with faults planted, for chaos tests (harness only; the product never imports it).

    python -m rocshare_dev.devcluster.faults [--choke-facts PREFIX] [--raise PREFIX:TIMES] -- operator ...

runs `rocshare` (the arguments after ``--``) in this process after patching:
* ``--choke-facts PREFIX``: the pod fact decoder (``cluster_facts._pod_facts``) raises on every
  pod whose name starts with PREFIX -- a pod object the operator cannot read;
* ``--raise PREFIX:TIMES``: a step of the extender's pod path (``--raise-in``: the accounting,
  ``Accounts.on_pod``, by default; the fragmentation model; the waiting list) raises on the first
  TIMES events of each pod whose name starts with PREFIX -- a handler that fails and must be retried;
* ``--choke-node-facts PREFIX``: the Node decoder raises on nodes whose kubernetes.io/hostname label
  starts with PREFIX.
Each plant returns its undo, for unit tests that plant faults in their own process.
Each planted fault logs a line with ``planted fault`` so tests can tell it fired.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Callable, Sequence

log = logging.getLogger("rocshare_dev.faults")


class PlantedFault(RuntimeError):
    """Raised where a test asked for a failure."""


Undo = Callable[[], None]


def choke_facts(prefix: str) -> Undo:
    from rocshare_operator.feed import cluster_facts

    real = cluster_facts._pod_facts

    def choking(pod):
        name = ((pod.get("metadata") or {}).get("name") or "") if isinstance(pod, dict) else ""
        if name.startswith(prefix):
            log.warning("planted fault: the fact decoder chokes on pod %s", name)
            raise PlantedFault(f"planted: cannot read pod {name}")
        return real(pod)

    cluster_facts._pod_facts = choking
    return lambda: setattr(cluster_facts, "_pod_facts", real)


def choke_node_facts(prefix: str) -> Undo:
    """The Node decoder fails part-way (reading the node's pool marks) on nodes whose
    kubernetes.io/hostname label starts with PREFIX: a Node the operator can no longer read."""
    from rocshare_operator.feed import cluster_facts

    real = cluster_facts.marks_of

    def choking(labels, *args, **kwargs):
        name = labels.get("kubernetes.io/hostname", "")
        if name.startswith(prefix):
            log.warning("planted fault: the Node decoder chokes on node %s", name)
            raise PlantedFault(f"planted: cannot read node {name}")
        return real(labels, *args, **kwargs)

    cluster_facts.marks_of = choking
    return lambda: setattr(cluster_facts, "marks_of", real)


def _event_steps() -> dict[str, tuple[type, str, str]]:
    """The steps of the extender's pod path a fault can be planted in (each takes the event's kind
    and the pod's facts)."""
    from rocshare_operator.holds import Accounts
    from rocshare_operator.extender.state import SchedulerState
    from rocshare_operator.extender.workloads import PoolWorkloads

    return {"accounts": (Accounts, "on_pod", "accounting"),
            "workloads": (PoolWorkloads, "on_pod", "the fragmentation model"),
            "waiting": (SchedulerState, "_track_waiting", "the waiting list")}


def raise_on_events(prefix: str, times: int, step: str = "accounts") -> Undo:
    from rocshare_operator.feed.cluster_facts import PodFacts

    owner, name, what = _event_steps()[step]
    real = getattr(owner, name)
    raised: Counter[str] = Counter()

    def failing(self, *args, **kwargs):
        pod = next(arg for arg in (*args, *kwargs.values()) if isinstance(arg, PodFacts))
        if pod.name.startswith(prefix) and raised[pod.key] < times:
            raised[pod.key] += 1
            log.warning("planted fault: %s raises on %s (%d of %d)", what, pod.key, raised[pod.key], times)
            raise PlantedFault(f"planted: {what} failed on {pod.key}")
        return real(self, *args, **kwargs)

    setattr(owner, name, failing)
    return lambda: setattr(owner, name, real)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="rocshare_dev.devcluster.faults")
    parser.add_argument("--choke-facts", default=None)
    parser.add_argument("--raise", dest="raise_", default=None, help="PREFIX:TIMES")
    parser.add_argument("--raise-in", default="accounts", choices=("accounts", "workloads", "waiting"),
                        help="the step of the pod path --raise plants its fault in")
    parser.add_argument("--choke-node-facts", default=None)
    args = parser.parse_args(argv[:split])
    if args.choke_facts:
        choke_facts(args.choke_facts)
    if args.raise_:
        prefix, _, times = args.raise_.rpartition(":")
        raise_on_events(prefix, int(times), args.raise_in)
    if args.choke_node_facts:
        choke_node_facts(args.choke_node_facts)
    from rocshare.cli import main as rocshare_main

    return rocshare_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
