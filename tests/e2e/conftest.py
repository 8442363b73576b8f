"""The real control plane for e2e tests: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler v1.35 (built by `make controlplane`), started once per test session
in a temp folder on free loopback ports, with crds/ installed. Torn down at the end;
no process is left behind. Missing binaries fail the session: an e2e test that skips
proves nothing. The control plane serves DRA with consumable capacity (on 1.35 its alpha gate,
dra_feature_gates), as `make demo` does: test_samples.py runs samples/dra/ on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane, Ports, dra_feature_gates, k8s_version
from rocshare.kube.client import Kube

SHARED = (PROJECT_ROOT / ".." / "shared").resolve()
SYSFS_FIXTURES = SHARED / "fixtures" / "sysfs"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    control_plane = ControlPlane(root=tmp_path_factory.mktemp("cluster"), ports=Ports.free(),
                                 feature_gates=dra_feature_gates(k8s_version()))
    try:
        control_plane.start()
        control_plane.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        control_plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture
async def kube(cluster: ControlPlane) -> AsyncIterator[Kube]:
    client = await Kube.connect(cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="session")
def sysfs_fixtures() -> Path:
    assert SYSFS_FIXTURES.is_dir(), f"missing {SYSFS_FIXTURES}: tests read ../shared in place"
    return SYSFS_FIXTURES


@pytest.fixture(scope="module", autouse=True)
def module_leaves_no_nodes(cluster: ControlPlane) -> Iterator[None]:
    """Modules share one control plane; Nodes (with the pods bound to them) that a module made are
    removed after it, so no later module can schedule onto a node whose kubelet is gone."""
    before = set(_names(cluster, "nodes"))
    yield
    for node in sorted(set(_names(cluster, "nodes")) - before):
        node = node.removeprefix("node/")
        cluster.kubectl("delete", "pods", "-A", f"--field-selector=spec.nodeName={node}", "--force",
                        "--grace-period=0", "--wait=false", check=False)
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)


def _names(cluster: ControlPlane, kind: str) -> list[str]:
    return cluster.kubectl("get", kind, "-o", "name").stdout.split()
