"""`rocshare-dev cluster up|down [--root DIR]`: the local control plane
for people (`make cluster-up`, `make cluster-down`), on fixed loopback ports so the
kubeconfig it writes stays valid across runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane, ControlPlaneError, Ports, load

DEFAULT_ROOT = PROJECT_ROOT / "run" / "cluster"


def _up(root: Path) -> int:
    if (root / "state.json").exists():
        print(f"control plane already recorded in {root}; run `make cluster-down` first if it is not answering")
        return 0
    control_plane = ControlPlane(root=root, ports=Ports.fixed())
    control_plane.start()
    control_plane.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
    control_plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    bin_dir = control_plane.bin_dir
    print(f"control plane up: {control_plane.server_url()} (logs in {control_plane.logs})")
    print(f"  export KUBECONFIG={control_plane.kubeconfig}")
    print(f"  export PATH={bin_dir}:$PATH   # kubectl matching the server")
    print("  kubectl get amdgpupools,amdgpunodes,amdgpushares")
    return 0


def _down(root: Path) -> int:
    if not (root / "state.json").exists():
        print(f"no control plane recorded in {root}")
        return 0
    load(root).stop()
    print("control plane stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocshare-dev cluster", description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"state folder (default {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    try:
        return _up(args.root) if args.action == "up" else _down(args.root)
    except ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
