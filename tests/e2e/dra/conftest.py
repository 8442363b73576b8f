"""The DRA e2e's own control plane: Kubernetes 1.37.2 (DRA_K8S_VERSION), whatever K8S_VERSION the
rest of the suite runs on, since consumable capacity is on by default only from 1.36 (on 1.35 the
API server would drop the fields these tests check). It overrides the suite's `cluster` fixture for
the tests in this folder, so `kube` and the module clean-up use it; kube-scheduler runs with a plain
profile (no rocshare extender: in DRA mode kube-scheduler's own DRA plugin allocates), and
rocshare's CRDs and DeviceClass are installed as the base manifests ship them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from rocshare_dev.devcluster.controlplane import DRA_K8S_VERSION, PROJECT_ROOT, ControlPlane, Ports

PLAIN_SCHEDULER = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                   "leaderElection": {"leaderElect": False}}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    root = tmp_path_factory.mktemp("dra-cluster")
    control_plane = ControlPlane(root=root, ports=Ports.free(), version=DRA_K8S_VERSION, with_scheduler=False)
    try:
        control_plane.start()
        config = root / "plain-scheduler.yaml"
        config.write_text(yaml.safe_dump({**PLAIN_SCHEDULER, "clientConnection": {
            "kubeconfig": str(control_plane.kubeconfig), "qps": 200, "burst": 400}}))
        control_plane.start_scheduler(config_path=config)
        control_plane.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        control_plane.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "manifests/base/dra/deviceclass.yaml"))
        control_plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield control_plane
    finally:
        control_plane.stop()
