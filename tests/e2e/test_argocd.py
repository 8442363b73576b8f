"""rocshare driven only through a real Argo CD (issue 32): its application controller and repo
server, built from Argo CD's Go module (dev/argocd/build.sh), read this working tree from a Git
server on loopback and write to the real kube-apiserver; the operator runs as in the other e2e
tests and a simulated MI210 node joins when the test says so.

The Application is the shipped manifests/argocd/application.yaml (its sync policy, sync options
and ignoreDifferences), pointed at the local Git server and at a part of samples/: the MI210
pool (wave 2), the gpu-demo namespace (2), the team-demo share (3) and the 4 GiB / 25 % pod (4).
The shipped health checks (manifests/argocd/argocd-cm-health.yaml) are merged into argocd-cm as
the README says. What is asserted comes from the API server (objects, their conditions, the
pod's allocation and what the kubelet peer handed its container, every version of the
Application a watch delivered), not from Argo CD's latest status alone.

The operator itself, installed through Argo CD from the Helm chart, is proven where its
containers can run: tests/realnode/test_argocd.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from rocshare.kube.client import Kube
from rocshare_dev.devcluster.captures import mi210_with_synthetic_vram
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.argocd_world import NAMESPACE, ArgoCd, build_argocd, build_helm, shipped_application
from tests.e2e.fleet import record_of, runtime_of, wait_for, wait_running

pytestmark = pytest.mark.e2e

APP = "rocshare-samples"
SAMPLE_FILES = ("00-namespace.yaml", "13-pool-mi210-oversubscribed.yaml", "20-share.yaml",
                "30-pod-gpumem-gpucores.yaml")
POOL, SHARE, SHARE_NS, POD = "mi210", "team-demo", "gpu-demo", "slice-4g-25pct"
NODE = "argocd-mi210"
RESYNC_S = 10
"""--app-resync in argocd_world: the controller compares Git with the cluster this often."""


@pytest.fixture(scope="module")
def mi210_node(cluster: ControlPlane, sysfs_fixtures,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedNode]:
    """A simulated MI210 node matching the sample pool, not started: the test starts it when it wants
    the pool ready. Stopped after the Argo CD fixture has removed what it synced."""
    root = tmp_path_factory.mktemp("argocd-node")
    node = SimulatedNode(name=NODE, kubeconfig=cluster.kubeconfig, work_dir=root,
                         sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, root / "sysfs"),
                         labels={"rocshare.io/node-class": "mi210"})
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def argocd(cluster: ControlPlane, mi210_node: SimulatedNode,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCd]:
    world = ArgoCd(cluster, root=tmp_path_factory.mktemp("argocd"), bin_dir=build_argocd(),
                   helm_dir=build_helm().parent)
    operator = OperatorProcess(cluster)
    try:
        operator.start()
        operator.install_webhooks()
        world.start()
        yield world
    finally:
        # The Applications' finalizer has Argo CD delete what it synced, while it still runs; pods on
        # the simulated node are forced out so that their namespace can go.
        cluster.kubectl("-n", NAMESPACE, "delete", "applications", "--all", "--wait=false", check=False)
        cluster.kubectl("delete", "pods", "--all", "-n", SHARE_NS, "--force", "--grace-period=0", check=False)
        cluster.kubectl("-n", NAMESPACE, "wait", "--for=delete", "applications", "--all", "--timeout=90s",
                        check=False)
        world.stop()
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        # The pools go while the operator runs: their finalizer unmarks the nodes first.
        cluster.kubectl("delete", "amdgpupools", "--all", "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", SHARE_NS, "--ignore-not-found", "--timeout=60s", check=False)
        operator.stop()


def sample_waves() -> dict[tuple[str, str], int]:
    """(kind, name) -> sync wave of each object in SAMPLE_FILES, read from the files."""
    waves = {}
    for name in SAMPLE_FILES:
        for obj in yaml.safe_load_all((PROJECT_ROOT / "samples" / name).read_text()):
            waves[(obj["kind"], obj["metadata"]["name"])] = int(
                obj["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])
    return waves


WAVES = sample_waves()


def key(result: dict[str, Any]) -> tuple[str, str]:
    return result["kind"], result["name"]


def first_operation(versions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The versions of the Application that carry its first operation's state, up to the one where
    it finished. Argo CD may start another operation right after (self-heal: its live cache has not
    yet seen the object the last wave created, so that object looks missing and it applies it
    again); that one replaces status.operationState but is not part of the first pass."""
    states = [v for v in versions if v.get("status", {}).get("operationState")]
    assert states, "no operation recorded"
    started = states[0]["status"]["operationState"]["startedAt"]
    first = [v for v in states if v["status"]["operationState"]["startedAt"] == started]
    done = [i for i, v in enumerate(first) if v["status"]["operationState"]["phase"] != "Running"]
    assert done, f"the first operation (started {started}) never finished"
    return first[:done[0] + 1]


def assert_waves_in_order(states: list[dict[str, Any]]) -> None:
    """The applied set only grows from one recorded result to the next, and among the results is
    each wave's prefix exactly (everything up to wave w, nothing after): wave w was written, and
    stood, before any object of a later wave was applied."""
    seen: list[frozenset[tuple[str, str]]] = []
    for version in states:
        applied = frozenset(key(r) for r in version["status"]["operationState"].get("syncResult", {})
                            .get("resources", []))
        if applied and (not seen or applied != seen[-1]):
            seen.append(applied)
    for before, after in zip(seen, seen[1:]):
        assert before < after, f"the applied set shrank or changed: {sorted(before)} -> {sorted(after)}"
    prefixes = [frozenset(k for k, wave in WAVES.items() if wave <= last) for last in sorted(set(WAVES.values()))]
    assert [p for p in prefixes if p not in seen] == [], f"waves not applied one by one: {[sorted(a) for a in seen]}"


def get(cluster: ControlPlane, *args: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def resource(app: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in app.get("status", {}).get("resources", []):
        if entry["kind"] == kind and entry["name"] == name:
            return entry
    return None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


async def test_samples_sync_through_argocd(argocd: ArgoCd, mi210_node: SimulatedNode, cluster: ControlPlane,
                                          kube: Kube) -> None:
    include = "{" + ",".join(SAMPLE_FILES) + "}"
    record = argocd.record(APP)
    argocd.apply(shipped_application(argocd.repo_url, name=APP,
                                     source={"path": "samples", "directory": {"include": include}}))

    # 1. No node carries the pool's label yet: the operator says Ready=False NoNodes, the shipped Lua
    #    makes that Progressing, and Argo CD holds wave 3 (the share) back behind wave 2.
    async def pool_waiting():
        app = argocd.application(APP)
        entry = resource(app, "AmdGpuPool", POOL)
        return app if entry and entry.get("health", {}).get("status") == "Progressing" and \
            "NoNodes" in entry["health"].get("message", "") else None
    app = await wait_for(pool_waiting, timeout_s=120, what="the pool Progressing (NoNodes) in Argo CD")
    pool = get(cluster, "amdgpupool", POOL)
    assert pool is not None and condition(pool, "Ready")["status"] == "False"
    assert condition(pool, "Ready")["reason"] == "NoNodes"
    assert app["status"]["operationState"]["phase"] == "Running"
    assert get(cluster, "amdgpushare", SHARE, "-n", SHARE_NS) is None, "wave 3 applied before wave 2 was healthy"

    # 2. The node joins: the pool turns Ready, and the same sync goes on through waves 3 and 4.
    mi210_node.start()

    async def synced():
        app = argocd.application(APP)
        state = app.get("status", {}).get("operationState", {})
        return app if state.get("phase") == "Succeeded" and app["status"]["sync"]["status"] == "Synced" else None
    app = await wait_for(synced, timeout_s=180, what=f"{APP} synced")
    # One pass, in wave order, from every version of the Application the API server sent: Argo CD
    # writes the operation's result after each wave. A later operation may replace it in
    # status.operationState (see first_operation), so the test reads the first one from the watch.
    first = first_operation(record.versions())
    final = first[-1]["status"]["operationState"]
    assert final["phase"] == "Succeeded" and final.get("retryCount", 0) == 0, f"not one pass: {final}"
    assert final["operation"]["initiatedBy"].get("automated"), final["operation"]
    assert {key(r): r["status"] for r in final["syncResult"]["resources"]} == dict.fromkeys(WAVES, "Synced")
    assert_waves_in_order(first)
    # The first entry of the history is this operation: no earlier one applied anything.
    history = app["status"]["history"][0]
    assert (history["deployStartedAt"], history["revision"]) == (final["startedAt"], final["syncResult"]["revision"])
    # Waves in order, from the API server's own timestamps: each wave's objects were created after the
    # previous wave's were healthy.
    pool = get(cluster, "amdgpupool", POOL)
    share = get(cluster, "amdgpushare", SHARE, "-n", SHARE_NS)
    pod = get(cluster, "pod", POD, "-n", SHARE_NS)
    assert pool is not None and share is not None and pod is not None
    assert share["metadata"]["creationTimestamp"] >= condition(pool, "Ready")["lastTransitionTime"]
    assert pod["metadata"]["creationTimestamp"] >= condition(share, "Ready")["lastTransitionTime"]

    # 3. The pod Argo CD synced runs with its slice: 4096 MiB and 25 % of the GPU's own CUs.
    pod = await wait_running(kube, POD, SHARE_NS, timeout_s=120)
    (device,) = [d for container in record_of(pod).containers for d in container.devices]
    amd_node = get(cluster, "amdgpunode", record_of(pod).node)
    assert amd_node is not None
    gpu = next(g for g in amd_node["status"]["gpus"] if g["id"] == device.gpu_id)
    assert device.memory_mib == 4096 and device.cu_count == math.ceil(gpu["cuCount"] * 25 / 100)
    assert runtime_of(pod)["main"]["envs"]["HSA_CU_MASK"].count(":") == 1

    # Everything Healthy, the running pod too: the samples' pods carry Argo CD's
    # ignore-restart-policy annotation (a running restartPolicy Never pod is otherwise Progressing).
    async def healthy():
        app = argocd.application(APP)
        states = {kind: (resource(app, kind, name) or {}).get("health", {}).get("status")
                  for kind, name in (("AmdGpuPool", POOL), ("AmdGpuShare", SHARE), ("Pod", POD))}
        whole = app.get("status", {}).get("health", {}).get("status")
        return app if set(states.values()) == {"Healthy"} and whole == "Healthy" else None
    app = await wait_for(healthy, timeout_s=120, what="pool, share, pod and the Application Healthy in Argo CD")

    # 4. No perpetual diff: over three resyncs, while the operator and agent write status, Synced.
    first = app["status"]["reconciledAt"]
    seen = {first}
    deadline = time.monotonic() + 6 * RESYNC_S
    while len(seen) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(1)
        app = argocd.application(APP)
        assert app["status"]["sync"]["status"] == "Synced", json.dumps(app["status"].get("resources"), indent=1)
        seen.add(app["status"]["reconciledAt"])
    assert len(seen) >= 4, f"only {len(seen)} reconciliations in {6 * RESYNC_S} s"

    # 5. Prune: the share removed from Git goes from the cluster, through the operator's finalizer.
    share = get(cluster, "amdgpushare", SHARE, "-n", SHARE_NS)
    assert share is not None and share["metadata"].get("finalizers"), "the share has no finalizer to run"
    (argocd.repo / "samples" / "20-share.yaml").unlink()
    revision = argocd.commit("remove the team-demo share")
    argocd.refresh(APP)

    async def pruned():
        app = argocd.application(APP)
        done = app.get("status", {}).get("operationState", {}).get("syncResult", {}).get("revision") == revision
        return done and get(cluster, "amdgpushare", SHARE, "-n", SHARE_NS) is None
    await wait_for(pruned, timeout_s=120, what="the share pruned and gone")
