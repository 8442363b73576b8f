"""rocshare installed and driven only through a real Argo CD, on the real kubelet node (issue 32):
Argo CD v3.6.1's application controller and repo server (tests/e2e/argocd_world.py) sync an
Application whose source is the Helm chart (charts/rocshare, rendered by the repo server's own
`helm`), on the session's empty cluster: the CRDs, the operator Deployment (its real containers,
the images built here) and the webhooks all come from Argo CD. A second Application syncs a pool
for this node and a slice pod from the same Git server; the pod runs in its real container with
its slice. Both stay Synced over resyncs while the operator writes status and caBundles.

This module runs first in the session (alphabetical, before the kustomize install of
`deployed`), so the cluster has nothing of rocshare when Argo CD starts; its teardown deletes
both Applications (Argo CD removes what it synced, but for the CRDs) and then the CRDs, so later
modules start from an empty cluster again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocshare_dev.realnode import deploy
from rocshare_dev.realnode.rig import RealNode
from tests.e2e.argocd_world import NAMESPACE as ARGOCD_NAMESPACE
from tests.e2e.argocd_world import ArgoCd, build_argocd, build_helm, shipped_application
from tests.realnode.conftest import NAMESPACE, TIMINGS, describe, wait_for
from tests.realnode.test_helm import CHART, remove_kustomize_install, values_for_this_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
INSTALL, WORKLOADS_APP = "rocshare", "rocshare-realnode-workloads"
WORKLOADS, POD = "argocd-e2e", "argocd-slice"
FOLDER = "realnode-workloads"
"""Where the test commits the pool and the pod in the Git server's repository."""
RESYNC_S = 10


@pytest.fixture(scope="module")
def argocd(real_node: RealNode) -> Iterator[ArgoCd]:
    remove_kustomize_install(real_node)  # only when another module deployed first (pytest -k, reordering)
    cluster = real_node.control_plane
    world = ArgoCd(cluster, root=real_node.root / "argocd", bin_dir=build_argocd(), helm_dir=build_helm().parent)
    try:
        world.start()
        yield world
    finally:
        # The workloads first, while the operator still runs their pool's finalizer; then the install.
        for app in (WORKLOADS_APP, INSTALL):
            cluster.kubectl("-n", ARGOCD_NAMESPACE, "delete", "application", app, "--ignore-not-found",
                            "--timeout=300s", check=False, timeout_s=360)
        world.stop()
        leave_no_install(cluster, real_node.root / "argocd" / "leftovers.txt")


def leave_no_install(cluster, report: Path) -> None:
    """Argo CD never deletes CRDs when an Application goes (as `helm uninstall` keeps a chart's
    crds/), so the chart's CRDs stay, with the node's AmdGpuNode and the operator's peering object
    in them. Later modules install rocshare again from an empty cluster: delete them as a user
    would, and wait for the namespace too. Should a custom resource's finalizer hold a CRD (its
    operator is gone), what was left is written to `report` and the finalizers are dropped."""
    crds = [f"crd/{path.stem}" for path in sorted((CHART / "crds").glob("*.yaml"))]
    cluster.kubectl("delete", *crds, "--ignore-not-found", "--wait=false", check=False)
    waited = cluster.kubectl("wait", "--for=delete", *crds, f"namespace/{NAMESPACE}", "--timeout=120s",
                             check=False, timeout_s=150)
    if waited.returncode == 0:
        return
    kinds = [crd.removeprefix("crd/") for crd in crds]
    report.write_text(waited.stderr + "\n" + cluster.kubectl("get", ",".join(kinds), "-A", "-o", "yaml",
                                                              check=False).stdout)
    for name in cluster.kubectl("get", ",".join(kinds), "-A", "-o", "name", check=False).stdout.split():
        cluster.kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    cluster.kubectl("wait", "--for=delete", *crds, f"namespace/{NAMESPACE}", "--timeout=120s", check=False,
                    timeout_s=150)


def application(world: ArgoCd, name: str) -> dict[str, Any] | None:
    found = world.cluster.kubectl("-n", ARGOCD_NAMESPACE, "get", "application", name, "-o", "yaml", check=False)
    return yaml.safe_load(found.stdout) if found.returncode == 0 else None


def synced_and_healthy(world: ArgoCd, name: str) -> dict[str, Any] | None:
    app = application(world, name) or {}
    status = app.get("status", {})
    done = status.get("operationState", {}).get("phase") == "Succeeded"
    return app if done and status.get("sync", {}).get("status") == "Synced" and \
        status.get("health", {}).get("status") == "Healthy" else None


def explain(world: ArgoCd, name: str):
    def text() -> str:
        app = application(world, name) or {}
        return (yaml.safe_dump({"status": app.get("status", {})})[-6000:] + "\n" +
                describe(world.cluster, f"pods -n {NAMESPACE}") + "\ncontroller log:\n" +
                world.log("application-controller")[-3000:])
    return text


def workloads(host: deploy.HostPaths) -> list[dict[str, Any]]:
    """A pool for this node (wave 2), a namespace (2) and the sample slice on the image built here (4)."""
    pool = deploy.pool_manifest(host)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS}}
    pod = deploy.slice_pod(POD, WORKLOADS, memory_mib=2048, cores_pct=25)
    for obj, wave in ((pool, "2"), (namespace, "2"), (pod, "4")):
        obj["metadata"].setdefault("annotations", {})["argocd.argoproj.io/sync-wave"] = wave
    pod["metadata"]["annotations"]["argocd.argoproj.io/ignore-restart-policy"] = "true"
    return [namespace, pool, pod]


def stays_synced(world: ArgoCd, names: tuple[str, ...], *, resyncs: int) -> None:
    """Each Application is compared with Git `resyncs` more times and is Synced at every look."""
    seen: dict[str, set[str]] = {name: set() for name in names}
    deadline = time.monotonic() + (resyncs + 3) * RESYNC_S
    while min(len(s) for s in seen.values()) <= resyncs and time.monotonic() < deadline:
        for name in names:
            status = (application(world, name) or {}).get("status", {})
            assert status.get("sync", {}).get("status") == "Synced", f"{name}: {yaml.safe_dump(status)[-4000:]}"
            seen[name].add(status["reconciledAt"])
        time.sleep(1)
    assert min(len(s) for s in seen.values()) > resyncs, f"too few reconciliations: {seen}"


def test_operator_installed_and_driven_through_argocd(argocd: ArgoCd, real_node: RealNode) -> None:
    cluster = real_node.control_plane
    assert cluster.kubectl("get", "crd", "amdgpupools.rocshare.io", check=False).returncode != 0, \
        "rocshare's CRDs exist before Argo CD synced anything"

    # 1. The chart through Argo CD: the repo server renders charts/rocshare with the values this
    #    node needs (the images built here, the API server's name without cluster DNS).
    values = yaml.safe_load(values_for_this_node(real_node.root / "argocd-values").read_text())
    started = time.monotonic()
    argocd.apply(shipped_application(argocd.repo_url, name=INSTALL,
                                     source={"path": "charts/rocshare", "helm": {"valuesObject": values}}))
    app = wait_for(f"{INSTALL} Synced and Healthy", lambda: synced_and_healthy(argocd, INSTALL), timeout_s=600,
                   explain=explain(argocd, INSTALL))
    TIMINGS["Argo CD: chart Synced+Healthy"] = time.monotonic() - started
    assert app["status"]["sourceType"] == "Helm"
    kinds = {(r["kind"], r["name"]) for r in app["status"]["resources"]}
    assert {("CustomResourceDefinition", "amdgpupools.rocshare.io"), ("Deployment", "rocshare-operator"),
            ("MutatingWebhookConfiguration", "rocshare-pods")} <= kinds, sorted(kinds)
    # The operator's pods really run: every container of each ready, as the kubelet reports it.
    deployment = cluster.kubectl("get", "deployment", "-n", NAMESPACE, "rocshare-operator", "-o", "yaml",
                                 "--show-managed-fields").stdout
    deployment = yaml.safe_load(deployment)
    assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"], deployment["status"]
    managers = {m["manager"] for m in deployment["metadata"]["managedFields"] if m.get("operation") == "Apply"}
    assert managers == {"argocd-controller"}, managers

    # 2. A pool for this node and a slice pod, from Git through Argo CD.
    cluster.kubectl("label", "node", real_node.node_name, f"{deploy.NODE_CLASS_LABEL}={deploy.NODE_CLASS}",
                    "--overwrite")
    folder = argocd.repo / FOLDER
    folder.mkdir()
    host = deploy.prepare_host(real_node.root / "argocd-host")
    (folder / "workloads.yaml").write_text(yaml.safe_dump_all(workloads(host)))
    argocd.commit("a pool for the real node and a slice pod")
    started = time.monotonic()
    argocd.apply(shipped_application(argocd.repo_url, name=WORKLOADS_APP, source={"path": FOLDER}))
    wait_for(f"{WORKLOADS_APP} Synced and Healthy", lambda: synced_and_healthy(argocd, WORKLOADS_APP),
             timeout_s=420, explain=explain(argocd, WORKLOADS_APP))
    TIMINGS["Argo CD: pool and slice pod Synced+Healthy"] = time.monotonic() - started
    pod = yaml.safe_load(cluster.kubectl("get", "pod", "-n", WORKLOADS, POD, "-o", "yaml").stdout)
    assert pod["status"]["phase"] == "Running" and pod["spec"]["schedulerName"] == "rocshare-scheduler"
    env = cluster.kubectl("exec", "-n", WORKLOADS, POD, "--", "env").stdout
    assert "HIP_DEVICE_MEMORY_LIMIT_0=2048m" in env and "LD_AUDIT=/usr/local/vgpu/libamvgpu.so" in env, env

    # 3. No perpetual diff while the operator writes status, caBundles and its peering.
    stays_synced(argocd, (INSTALL, WORKLOADS_APP), resyncs=3)
