"""rocshare installed with Helm on the real node, as HAMi's users install (README.md, "Install on a cluster"; docs/install.md):
`helm install` of charts/rocshare with the images built here, a pool, a slice pod Running in
its real container; `helm upgrade` with a changed value that reaches the running operator pods, while slice pods are
being created (none refused, all running, disjoint, no slice leaked);
`helm uninstall` leaves none of the chart's objects: only its CRDs (Helm never deletes a
chart's crds/), and in them the Kopf peering object the operator made and the node's AmdGpuNode
(owned by its Node). helm is built from its Go module
(dev/helm/build.sh). These tests run last in the session (conftest): when the session deployed
with kustomize first, that install is removed before Helm's."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rocshare_dev.devcluster import evidence
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SERVICE_CIDR, ControlPlane
from rocshare_dev.realnode import deploy
from rocshare_dev.realnode.network import kubernetes_service_ip
from rocshare_dev.realnode.rig import RealNode
from tests.realnode.conftest import NAMESPACE, TIMINGS, describe, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
CHART = PROJECT_ROOT / "charts" / "rocshare"
RELEASE = "rocshare"
WORKLOADS = "helm-e2e"
UPGRADE_PODS = 8
UPGRADE_CREATE_GAP_S = 3.0
UPGRADE_TAG = "upgraded"  # the operator image tag `helm upgrade` moves to (test_helm_upgrade_under_load_refuses_nothing)
"""Slice pods created one by one while `helm upgrade` rolls the two operator replicas (~25 s)."""


@dataclass
class Release:
    node: RealNode
    cluster: ControlPlane
    helm: Path
    values: Path
    host: deploy.HostPaths

    def run(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.helm), *args, f"--kubeconfig={self.cluster.kubeconfig}"],
                                capture_output=True, text=True, timeout=timeout_s)
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
        return result

    def json(self, *args: str) -> dict:
        return json.loads(self.cluster.kubectl(*args, "-o", "json").stdout)


def helm_binary() -> Path:
    built = subprocess.run([str(PROJECT_ROOT / "dev" / "helm" / "build.sh")], capture_output=True, text=True,
                           timeout=1800)
    assert built.returncode == 0, built.stderr[-2000:]
    return Path(built.stdout.strip().splitlines()[-1])


def values_for_this_node(folder: Path) -> Path:
    """The images built here (never pulled) and, as there is no cluster DNS, the API server's name."""
    (operator_repo, operator_tag), (scheduler_repo, scheduler_tag) = (
        deploy.IMAGES["rocshare/operator"], deploy.IMAGES["registry.k8s.io/kube-scheduler"])
    values = {
        "global": {"imagePullPolicy": "Never"},
        "operator": {"image": {"repository": operator_repo, "tag": operator_tag},
                     "hostAliases": [{"ip": kubernetes_service_ip(SERVICE_CIDR),
                                      "hostnames": ["kubernetes.default.svc", "kubernetes.default"]}]},
        "scheduler": {"image": {"repository": scheduler_repo, "tag": scheduler_tag}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def remove_kustomize_install(node: RealNode) -> None:
    """The session's `kubectl apply -k` install, if it ran: its pools first (the operator
    removes their finalizers and node marks), then every object of the overlay."""
    overlay = node.root / "overlay"
    if not overlay.exists():
        return
    cluster = node.control_plane
    cluster.kubectl("delete", "amdgpupools", "--all", "--wait=true", "--timeout=180s", check=False)
    cluster.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true", "--timeout=300s",
                    timeout_s=360, check=False)


def operator_ready(release: Release, *, memory_limit: str | None = None) -> dict | None:
    pods = release.json("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=rocshare-operator")["items"]
    for pod in pods:
        # The operator is a native sidecar: an init container (issue 30).
        operator = next(c for c in pod["spec"].get("initContainers", []) if c["name"] == "operator")
        if memory_limit is not None and operator["resources"]["limits"]["memory"] != memory_limit:
            continue
        statuses = [*pod["status"].get("initContainerStatuses", []), *pod["status"].get("containerStatuses", [])]
        if statuses and all(s.get("ready") for s in statuses) and not pod["metadata"].get("deletionTimestamp"):
            return pod
    return None


@pytest.fixture(scope="module")
def release(real_node: RealNode) -> Iterator[Release]:
    remove_kustomize_install(real_node)
    host = deploy.prepare_host(real_node.root / "helm-host")
    # The hook folder stays empty: the agent the chart deploys installs rocshare's hook there.
    release = Release(node=real_node, cluster=real_node.control_plane, helm=helm_binary(),
                      values=values_for_this_node(real_node.root / "helm"), host=host)
    yield release
    subprocess.run([str(release.helm), "uninstall", RELEASE, f"--kubeconfig={release.cluster.kubeconfig}"],
                   capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def installed(release: Release) -> Release:
    started = time.monotonic()
    release.run("install", RELEASE, str(CHART), "-f", str(release.values), "--wait", "--timeout=10m", timeout_s=700)
    TIMINGS["helm install --wait"] = time.monotonic() - started
    return release


def test_helm_install_runs_the_operator_and_a_slice_pod(installed: Release) -> None:
    release = installed
    assert operator_ready(release) is not None, describe(release.cluster, f"pods -n {NAMESPACE}")
    status = release.run("status", RELEASE, "-o", "json").stdout
    assert json.loads(status)["info"]["status"] == "deployed"
    cluster = release.cluster
    cluster.kubectl("label", "node", release.node.node_name, f"{deploy.NODE_CLASS_LABEL}={deploy.NODE_CLASS}",
                    "--overwrite")
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(deploy.pool_manifest(release.host)))
    cluster.kubectl("create", "namespace", WORKLOADS, check=False)
    cluster.kubectl("wait", "-n", WORKLOADS, "--for=jsonpath={.metadata.name}=default", "serviceaccount/default",
                    "--timeout=60s")
    pod = deploy.slice_pod("helm-slice", WORKLOADS, memory_mib=2048, cores_pct=25)
    wait_for("amd.com/gpu on the node", lambda: release.json("get", "node", release.node.node_name)["status"][
        "allocatable"].get("amd.com/gpu", "0") not in ("0", None), timeout_s=300,
        explain=lambda: describe(cluster, f"pods -n {NAMESPACE}"))
    cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
    running = wait_for("the slice pod Running", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        release.json("get", "pod", "-n", WORKLOADS, "helm-slice")), timeout_s=240,
        explain=lambda: describe(cluster, f"pod -n {WORKLOADS} helm-slice"))
    env = cluster.kubectl("exec", "-n", WORKLOADS, "helm-slice", "--", "env").stdout
    assert running["spec"]["schedulerName"] == "rocshare-scheduler"
    assert "HIP_DEVICE_MEMORY_LIMIT_0=2048m" in env and "LD_AUDIT=/usr/local/vgpu/libamvgpu.so" in env, env


def test_helm_upgrade_under_load_refuses_nothing(installed: Release) -> None:
    """Issue 30: `helm upgrade` to a changed operator image (a new tag, as a release would bring, and a
    new memory limit: both replicas are replaced, one at a time) while slice pods are being created.
    Every creation is accepted, every pod runs, the slices are disjoint and within VRAM as read inside
    the containers (their environment and /dev/dri), and after they are deleted a pod asking for every
    GPU whole runs: no slice leaked."""
    release, cluster = installed, installed.cluster
    operator_repo, operator_tag = deploy.IMAGES["rocshare/operator"]
    # The node never pulls: the new tag names the image built here, tagged in the node's containerd.
    release.node.containerd.ctr("images", "tag", "--force", f"{operator_repo}:{operator_tag}",
                                f"{operator_repo}:{UPGRADE_TAG}")
    names = [f"upgrade-{index:02d}" for index in range(UPGRADE_PODS)]
    refused: list[str] = []

    def create_pods() -> None:
        for name in names:
            pod = deploy.slice_pod(name, WORKLOADS, memory_mib=1024, cores_pct=10)
            created = cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod), check=False)
            if created.returncode != 0:
                refused.append(f"{name}: {created.stderr.strip()}")
            time.sleep(UPGRADE_CREATE_GAP_S)

    creating = threading.Thread(target=create_pods)
    creating.start()
    release.run("upgrade", RELEASE, str(CHART), "-f", str(release.values), "--reuse-values",
                "--set", "operator.resources.limits.memory=768Mi", "--set", f"operator.image.tag={UPGRADE_TAG}",
                "--wait", "--timeout=10m", timeout_s=700)
    creating.join()
    assert not refused, refused
    pod = wait_for("an operator pod with the new memory limit ready", lambda: operator_ready(release, memory_limit="768Mi"),
                   timeout_s=300, explain=lambda: describe(cluster, f"pods -n {NAMESPACE}"))
    assert pod is not None
    operator = next(c for c in pod["spec"]["initContainers"] if c["name"] == "operator")
    assert operator["image"] == f"{operator_repo}:{UPGRADE_TAG}", operator["image"]
    history = json.loads(release.run("history", RELEASE, "-o", "json").stdout)
    assert [entry["revision"] for entry in history] == [1, 2] and history[-1]["status"] == "deployed"
    wait_for("every pod created during the upgrade Running", lambda: all(
        phase == "Running" for phase in _phases(release, names)) or None, timeout_s=300,
        explain=lambda: describe(cluster, f"pods -n {WORKLOADS}"))
    gpus = evidence.inventories(release.json("get", "amdgpunodes")["items"])[release.node.node_name]
    live = [*names, "helm-slice"]  # the install test's slice runs on as well
    shares = [share for name in live for share in evidence.shares_of(
        f"{WORKLOADS}/{name}", release.node.node_name, {"c": received_in(cluster, name)}, gpus)]
    assert len(shares) == len(live)
    problems = [problem for index, share in enumerate(shares) for problem in evidence.conflicts(share, shares[:index])]
    assert not problems, problems
    cluster.kubectl("delete", "pods", "--all", "-n", WORKLOADS, "--wait=true", "--timeout=180s")
    whole = deploy.slice_pod("every-gpu", WORKLOADS, memory_mib=1, cores_pct=1)
    whole["spec"]["containers"][0]["resources"]["limits"] = {"amd.com/gpu": str(len(gpus))}
    cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump(whole))
    wait_for("a pod with every GPU Running (no slice leaked)", lambda: _phases(release, ["every-gpu"]) == ["Running"]
             or None, timeout_s=240, explain=lambda: describe(cluster, f"pod -n {WORKLOADS} every-gpu"))


def _phases(release: Release, names: list[str]) -> list[str | None]:
    pods = {pod["metadata"]["name"]: pod for pod in release.json("get", "pods", "-n", WORKLOADS)["items"]}
    return [(pods.get(name) or {}).get("status", {}).get("phase") for name in names]


def received_in(cluster: ControlPlane, name: str) -> dict:
    """What the container really has: its environment and its /dev/dri nodes, read inside it."""
    env = cluster.kubectl("exec", "-n", WORKLOADS, name, "--", "env").stdout
    dri = cluster.kubectl("exec", "-n", WORKLOADS, name, "--", "ls", "/dev/dri").stdout.split()
    envs = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    return {"envs": envs, "devices": [{"containerPath": f"/dev/dri/{entry}"} for entry in dri]}


def test_helm_uninstall_leaves_only_the_crds(installed: Release) -> None:
    release = installed
    cluster = release.cluster
    cluster.kubectl("delete", "namespace", WORKLOADS, "--wait=true", "--timeout=180s", check=False)
    cluster.kubectl("delete", "amdgpupools", "--all", "--wait=true", "--timeout=180s")  # the user's, before the operator goes
    release.run("uninstall", RELEASE, "--wait", "--timeout=5m", timeout_s=400)
    wait_for("namespace rocshare-system gone", lambda: cluster.kubectl(
        "get", "namespace", NAMESPACE, check=False).returncode != 0, timeout_s=300)
    rendered = release.node.root / "helm" / "rendered.yaml"  # every object of the chart but its CRDs
    rendered.write_text(release.run("template", RELEASE, str(CHART), "-f", str(release.values)).stdout)
    left = cluster.kubectl("get", "-f", str(rendered), "--ignore-not-found", "-o", "name").stdout.split()
    assert not left, left
    crds = {path.stem for path in (CHART / "crds").glob("*.yaml")}
    assert crds <= {item["metadata"]["name"] for item in release.json("get", "customresourcedefinitions")["items"]}
    # What stays in those CRDs: the peering object the operator made at start, and the node's
    # AmdGpuNode (owned by its Node, so it goes with the Node, or with the CRD).
    objects = [f"{kind}/{item['metadata']['name']}" for kind in sorted(crds)
               for item in release.json("get", kind, "-A")["items"]]
    assert sorted(objects) == sorted(["clusterkopfpeerings.kopf.dev/rocshare",
                                      f"amdgpunodes.rocshare.io/{release.node.node_name}"]), objects
    node = release.json("get", "node", release.node.node_name)["metadata"]
    marks = [k for k in {**node.get("labels", {}), **node.get("annotations", {})} if k.startswith("rocshare.io/")
             and k != deploy.NODE_CLASS_LABEL]
    assert not marks, marks
