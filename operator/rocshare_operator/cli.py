"""Run the rocshare operator: reconcile AmdGpuPools (node marks, node-agent DaemonSets,
status), AmdGpuShares (ResourceQuotas, status) and watch Nodes, AmdGpuNodes and pods.

Runs until SIGINT or SIGTERM. `--standalone` skips Kopf peering (tests, a single
replica); otherwise replicas coordinate through the ClusterKopfPeering `rocshare`.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: the in-cluster service account, else $KUBECONFIG)")
    parser.add_argument("--namespace", default="rocshare-system",
                        help="namespace of the operator and the node-agent DaemonSets (default: %(default)s)")
    parser.add_argument("--standalone", action="store_true", help="run without Kopf peering")
    parser.add_argument("--verbose", action="store_true", help="log Kopf's handling in detail")
    from rocshare_operator import scheduling_flags

    scheduling_flags.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import asyncio

    import kopf

    from rocshare_operator import scheduling
    from rocshare_operator.reconcilers.kopf_app import operator_settings, run_operator

    kopf.configure(verbose=args.verbose)
    settings = operator_settings(standalone=args.standalone)
    extra_tasks = scheduling.prepare(args, settings)
    asyncio.run(run_operator(kubeconfig=args.kubeconfig, namespace=args.namespace, standalone=args.standalone,
                             extra_tasks=extra_tasks, settings=settings))
    return 0
