"""Each kind is watched once per process -- the operator and the node agent -- counted by the
API server itself.

The operator runs as it ships: following kube-scheduler's Lease (`--scheduler-lease`, Kopf
peering through ClusterKopfPeering `rocshare`), with its scheduler extender, which reads pools,
nodes, pods, AmdGpuNodes and quotas too. It leads: the Lease names its host as a kube-scheduler
there would (`<host>_<uuid>`), so Kopf runs and the pool and share loops run. Objects are present
before it starts -- two pools, two AmdGpuShares, a ResourceClaim -- so a watch opened per object
would be counted. The count is kube-apiserver's own gauge
`apiserver_longrunning_requests{verb="WATCH"}` per resource, read from its /metrics before the
operator starts and once every watch the operator needs is open: the difference is what the
operator holds open. kube-controller-manager and kube-scheduler watch many of the same kinds;
their watches are in the baseline. Both sides are the same statistic -- the median of SAMPLES
readings a second apart, after a settling window of SETTLE_S -- so a watch reconnecting during a
sample moves neither side, and no side is biased towards passing (the test used to take the
baseline's highest reading against the operator's lowest). The controller-manager's garbage
collector and quota monitors find custom resources by discovery, every 30 s: the baseline waits
until they watch rocshare's kinds, or their watches opening later would count as the operator's.

The node agent runs as the e2e suite runs it (a simulated node: the kubelet peer and
`rocshare agent` on a sysfs capture); its watches are counted the same way, the baseline taken
with the node's kubelet peer up and the agent stopped.

Fails on main before issue 34's end: AmdGpuPools were watched by Kopf (the pool daemons and
finalizer) and by the extender's own Informer -- 2.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import time
import uuid
from datetime import datetime, timezone
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rocshare_dev.devcluster.controlplane import ControlPlane, free_port
from rocshare_dev.devcluster.replica import LEASE, install_peering
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.test_operator import AGENT_NAMESPACE, ROCSHARE

pytestmark = pytest.mark.e2e

OPERATOR_KINDS = ("nodes", "pods", "amdgpunodes", "resourcequotas", "amdgpupools", "amdgpushares", "daemonsets",
                  "resourceclaims", "leases", "clusterkopfpeerings")
"""What the operator must watch (the extender's caches, the reconcilers, Kopf's share loops, the
agent DaemonSets, kube-scheduler's Lease and Kopf's peering): each must show up once, so that the
count is not vacuous."""
SCHEDULER_HOST = "watches-replica"
NAMESPACE = "watches"
AGENT_KINDS = ("pods",)
"""The agent's one watch: its node's pods (the device plugin's pod cache)."""
CAPTURE = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "sysfs" / "mi210-8gpu-xgmi"
OPEN_WITHIN_S = 60.0
CUSTOM_KINDS = ("rocshare.io/amdgpupools", "rocshare.io/amdgpushares", "rocshare.io/amdgpunodes")
PEERING_KIND = "kopf.dev/clusterkopfpeerings"
DISCOVERY_WITHIN_S = 90.0
SAMPLES = 9
SAMPLE_GAP_S = 1.0
SETTLE_S = 10.0
"""After the last needed watch opens, how long any second watch of a kind has to open."""


def watch_counts(cluster: ControlPlane) -> Counter[str]:
    """Open WATCH requests per group/resource, from kube-apiserver's /metrics."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_longrunning_requests":
            continue
        for sample in family.samples:
            if sample.labels.get("verb") == "WATCH" and not sample.labels.get("subresource"):
                counts[f"{sample.labels.get('group', '')}/{sample.labels['resource']}"] += int(sample.value)
    return counts


def median_of(readings: list[Counter[str]]) -> Counter[str]:
    """Per resource, the median reading (the statistic both sides of the difference use)."""
    kinds = set().union(*readings)
    return Counter({kind: int(statistics.median_low([reading[kind] for reading in readings])) for kind in kinds})


def sampled(cluster: ControlPlane) -> Counter[str]:
    """Per resource, the median of SAMPLES readings SAMPLE_GAP_S apart."""
    readings = []
    for index in range(SAMPLES):
        if index:
            time.sleep(SAMPLE_GAP_S)
        readings.append(watch_counts(cluster))
    return median_of(readings)


def settled_baseline(cluster: ControlPlane, custom_kinds: tuple[str, ...] = CUSTOM_KINDS) -> Counter[str]:
    """The baseline, once the controller-manager watches every rocshare kind (see above)."""
    deadline = time.monotonic() + DISCOVERY_WITHIN_S
    while not all(watch_counts(cluster)[kind] >= 1 for kind in custom_kinds):
        assert time.monotonic() < deadline, f"kube-controller-manager never watched {custom_kinds}"
        time.sleep(1.0)
    return sampled(cluster)


def by_resource(counts: Counter[str]) -> dict[str, int]:
    return {key.split("/", 1)[1]: value for key, value in counts.items() if value}


def objects_present() -> list[dict]:
    """Pools, shares and a claim, so that a watch opened per object shows up in the count."""
    pools = [{"apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuPool", "metadata": {"name": f"watches-{index}"},
              "spec": {"nodeSelector": {"rocshare.io/sim": f"watches-{index}"}}} for index in range(2)]
    shares = [{"apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuShare",
               "metadata": {"name": f"share-{index}", "namespace": NAMESPACE},
               "spec": {"limits": {"memoryMiB": 4096, "coresPercent": 100, "gpus": 2}}} for index in range(2)]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "claim-0", "namespace": NAMESPACE},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io"}}]}}}
    return [*pools, *shares, claim]


def leader_lease() -> dict:
    """kube-scheduler's Lease as a kube-scheduler on SCHEDULER_HOST holding it would write it."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": AGENT_NAMESPACE},
            "spec": {"holderIdentity": f"{SCHEDULER_HOST}_{uuid.uuid4()}", "leaseDurationSeconds": 3600,
                     "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}


@pytest.fixture
def operator_process(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path, Counter[str]]]:
    """The operator as it ships (following the Lease, peering), leading, with pools, shares and a
    claim present; started after the baseline of open watches is taken (which it yields too)."""
    cluster.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    install_peering(cluster)
    objects = [*objects_present(), leader_lease()]
    cluster.kubectl("apply", "-f", "-", input_text="\n---\n".join(json.dumps(obj) for obj in objects))
    baseline = settled_baseline(cluster, (*CUSTOM_KINDS, PEERING_KIND))
    log_path = tmp_path / "operator.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(
            [str(ROCSHARE), "operator", "--kubeconfig", str(cluster.kubeconfig), "--namespace", AGENT_NAMESPACE,
             f"--scheduler-lease={LEASE}", f"--scheduler-host={SCHEDULER_HOST}", "--no-webhook",
             "--extender-host", "127.0.0.1", "--extender-port", str(free_port()), "--metrics-port", str(free_port())],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process, log_path, baseline
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        cluster.kubectl("delete", "lease", LEASE, "-n", AGENT_NAMESPACE, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "amdgpupools", "watches-0", "watches-1", "--ignore-not-found", "--wait=false",
                        check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


async def held_once_each(cluster: ControlPlane, baseline: Counter[str], kinds: tuple[str, ...], *, who: str,
                         alive) -> dict[str, int]:
    """Wait until `who` has a watch open on each of `kinds`, then return what it holds per resource,
    asserting no resource more than once. `alive()` raises if the process died."""
    deadline = time.monotonic() + OPEN_WITHIN_S
    while True:
        alive()
        opened = by_resource(watch_counts(cluster) - baseline)
        if all(opened.get(kind, 0) >= 1 for kind in kinds):
            break
        assert time.monotonic() < deadline, f"the {who}'s watches did not all open: {opened}"
        await asyncio.sleep(0.5)
    await asyncio.sleep(SETTLE_S)  # any second watch of a kind would be open by now
    held = by_resource(await asyncio.to_thread(sampled, cluster) - baseline)
    assert set(kinds) <= set(held), held
    print(f"open WATCH requests the {who} holds, per resource: {held}")
    twice = {kind: count for kind, count in held.items() if count > 1}
    assert not twice, f"kinds the {who} watches more than once: {twice} (all: {held})"
    return held


async def test_the_operator_watches_each_kind_once(cluster: ControlPlane, operator_process) -> None:
    process, log_path, baseline = operator_process

    def alive() -> None:
        assert process.poll() is None, log_path.read_text()[-4000:]

    await held_once_each(cluster, baseline, OPERATOR_KINDS, who="operator", alive=alive)


async def test_the_node_agent_watches_each_kind_once(cluster: ControlPlane, tmp_path: Path) -> None:
    node = SimulatedNode(name="watches-agent", kubeconfig=cluster.kubeconfig, sysfs_root=CAPTURE.resolve(),
                         work_dir=tmp_path, bin_dir=cluster.bin_dir)
    node.start()
    try:
        node.stop_agent()
        baseline = settled_baseline(cluster)  # the kubelet peer's watches, and everyone else's
        node.start_agent()

        def alive() -> None:
            stat = Path(f"/proc/{node.agent_pid}/stat")
            running = stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
            assert running, (tmp_path / node.name / "agent.log").read_text()[-4000:]

        held = await held_once_each(cluster, baseline, AGENT_KINDS, who="node agent", alive=alive)
        assert set(held) == set(AGENT_KINDS), held
    finally:
        node.stop()
