"""`rocshare-dev real-node up|down [--root DIR] [--runtime containerd|containerd2]` (`make
real-node-up [REAL_NODE_RUNTIME=containerd]`, `make real-node-down`): the real node for people,
in ./run/realnode. `up` prints how to reach it and how to deploy. It runs on containerd 2.x
built from its Go module (CDI on, as DRA needs); `--runtime containerd` on Debian's 1.6; `down`
stops whichever runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SERVICE_CIDR
from rocshare_dev.realnode import deploy
from rocshare_dev.realnode.containerd import DEFAULT_RUNTIME, RUNTIMES
from rocshare_dev.realnode.netns import RigError
from rocshare_dev.realnode.rig import RealNode

DEFAULT_ROOT = PROJECT_ROOT / "run" / "realnode"


def _up(node: RealNode) -> int:
    node.up()
    overlay = deploy.write_overlay(node.root / "overlay", service_cidr=SERVICE_CIDR)
    host = deploy.prepare_host(node.root / "host")
    pool = node.root / "pool.yaml"
    pool.write_text(yaml.safe_dump(deploy.pool_manifest(host), sort_keys=False))
    bin_dir = node.bin_dir
    print(f"  export KUBECONFIG={node.kubeconfig} PATH={bin_dir}:$PATH")
    print(f"  kubectl apply --server-side -k {overlay}      # rocshare, as the README deploys it")
    print(f"  kubectl label node {node.node_name} {deploy.NODE_CLASS_LABEL}={deploy.NODE_CLASS}")
    print(f"  kubectl apply --server-side -f {pool}")
    print(f"  logs: {node.logs}; inside the namespace: ip netns exec {node.ns.name} ...")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocshare-dev real-node", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"run folder (default {DEFAULT_ROOT})")
    parser.add_argument("--runtime", choices=sorted(RUNTIMES), default=DEFAULT_RUNTIME,
                        help="the container runtime (default %(default)s: 2.x built by dev/containerd/build.sh, "
                             "CDI on; containerd: Debian's 1.6)")
    args = parser.parse_args(argv)
    node = RealNode(args.root, runtime=args.runtime)
    try:
        if args.action == "up":
            return _up(node)
        node.down()
        print("real node down")
        return 0
    except RigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
