"""The control plane is the Kubernetes version the build was asked for (K8S_VERSION; default
controlplane/k8s/default-version), every binary agrees on it, and the APIs rocshare relies on
are served at the versions its manifests name, on every supported minor (`make test-matrix`).
Differences between minors that the code handles are named where they are handled: the module
graph and the device manager's constructor in tests/unit/controlplane/test_k8s_versions.py."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SCHEDULER_CONFIG, k8s_version
from rocshare_dev.devcluster.operator_proc import POD_DEFAULTS_COMPONENTS, OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode

pytestmark = pytest.mark.e2e

SYSFS = (PROJECT_ROOT / ".." / "shared" / "fixtures" / "sysfs" / "strixpoint-apu").resolve()


def version_of(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()[-1]  # "Kubernetes v1.37.2"


def test_every_binary_is_the_built_version(cluster) -> None:
    wanted = f"v{k8s_version()}"
    for name in ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet"):
        assert version_of(cluster.bin_dir / name) == wanted, name
    client = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == wanted
    assert client["serverVersion"]["gitVersion"] == wanted
    assert client["serverVersion"]["minor"] == k8s_version().split(".")[1]


def test_kubelet_peer_reports_the_version_it_was_built_from(cluster, tmp_path_factory) -> None:
    """The peer's Node status says kubeletVersion as a kubelet does: its own build's version (it was a
    constant v1.35.4; the kube-scheduler and kubectl read it, and it must not lie on 1.37)."""
    node = SimulatedNode(name=f"sim-version-{uuid.uuid4().hex[:6]}", kubeconfig=cluster.kubeconfig,
                         sysfs_root=SYSFS, work_dir=tmp_path_factory.mktemp("simnodes"), bin_dir=cluster.bin_dir)
    node.start()
    try:
        info = json.loads(cluster.kubectl("get", "node", node.name, "-o", "json").stdout)["status"]["nodeInfo"]
        assert info["kubeletVersion"] == f"v{k8s_version()}"
    finally:
        node.stop()


def served(cluster, group_version: str) -> set[str]:
    path = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    result = cluster.kubectl("get", "--raw", path, check=False)
    if result.returncode != 0:
        return set()
    return {resource["name"] for resource in json.loads(result.stdout)["resources"]}


def test_the_apis_rocshare_uses_are_served_at_the_versions_it_names(cluster) -> None:
    """Every API version the manifests and the operator use is GA and served on both minors: the
    admission webhooks and the node-agent ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1,
    GA since 1.30), Bindings and pods (v1), Leases (coordination.k8s.io/v1)."""
    assert {"validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations"} <= served(cluster, "admissionregistration.k8s.io/v1")
    assert {"pods", "pods/binding", "pods/status", "nodes/status"} <= served(cluster, "v1")
    assert "leases" in served(cluster, "coordination.k8s.io/v1")
    assert "customresourcedefinitions" in served(cluster, "apiextensions.k8s.io/v1")


def test_the_scheduler_profile_api_version_is_accepted(cluster) -> None:
    """The shipped KubeSchedulerConfiguration is kubescheduler.config.k8s.io/v1, which both minors'
    kube-scheduler load (v1 is the only version served since 1.26); the running scheduler took it."""
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    log = (cluster.logs / "kube-scheduler.log").read_text(errors="replace")
    assert "no kind" not in log and "strict decoding error" not in log, log[-2000:]
    assert "kube-scheduler" in cluster.pids


def test_mutating_admission_policy_is_served_at_the_version_its_component_names(cluster) -> None:
    """A minor difference: MutatingAdmissionPolicy is beta (admissionregistration.k8s.io/v1beta1, gated;
    the local control plane turns the gate on) up to 1.35 and GA (v1, on by default, v1beta1 off) from
    1.36. The harness installs components/pod-defaults-policy or components/pod-defaults-policy-v1 by what
    is served, as a user must."""
    operator = OperatorProcess(cluster)
    minor = int(k8s_version().split(".")[1])
    expected = "v1" if minor >= 36 else "v1beta1"
    assert "mutatingadmissionpolicies" in served(cluster, f"admissionregistration.k8s.io/{expected}")
    if minor >= 36:
        assert "mutatingadmissionpolicies" not in served(cluster, "admissionregistration.k8s.io/v1beta1")
    else:
        assert "mutatingadmissionpolicies" not in served(cluster, "admissionregistration.k8s.io/v1")
    assert operator.mutating_admission_policy_version() == expected
    assert POD_DEFAULTS_COMPONENTS[expected].name == ("pod-defaults-policy-v1" if minor >= 36 else "pod-defaults-policy")
