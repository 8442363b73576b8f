"""Two operator replicas, one decider, on the real control plane (issue 30).

Each replica is an operator process and its own kube-scheduler with leader election on the
shipped Lease and timings (rocshare_dev.devcluster.replica). A burst of slice pods is created
while the leading replica is killed -- SIGKILL of both its processes, then, with the killed one back
as a standby, a graceful stop of the new leader. Pods are admitted by the pod admission policies
(no webhook: nothing in admission needs an operator), so no creation may be refused.

The kill is aimed: before the burst a bind is held open in the leader -- a pod in flight on a
node with no kubelet (bound, never admitted), a second pod's bind waiting behind it (the node's
in-flight gate) -- and the leader's kube-scheduler itself must count a bind under way
(`scheduler_goroutines{operation="binding"}`, read just before the kill). The successor must keep
the second pod back until the first is admitted (kube-scheduler's FailedScheduling naming it is
the signal), then bind it. The Lease's holder is polled from the API server all through the
burst, and every pod's bind (kube-scheduler's Scheduled event names its host) must come from the
replica that held the Lease then.

Checked from what the containers received (rocshare_dev/devcluster/evidence.py: the kubelet peer's record of
each pod's devices and environment, for every pod, as the watch saw it admitted): every pod ends
Running, no GPU is double-booked (disjoint CU ranges, memory limits within VRAM), no pod failed;
the surviving replica decides; Kopf's peering shows one peer at the leader's priority, so the
reconcilers run in one replica.

The session's kube-scheduler (no leader election, calling the control plane's extender port) is
paused (SIGSTOP) for this module, so the replicas' schedulers are the only ones placing GPU pods.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, NotFound, object_path
from rocshare_dev.devcluster.observe import LeaseLog, bindings, deciders_against_lease, scheduling_events, \
    wait_bind_refused_behind
from rocshare_dev.devcluster.replica import LEASE, OperatorReplica, install_peering
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare_operator.leadership import LEADER_PRIORITY
from rocshare_dev.devcluster.evidence import PodEvidence, stop_tasks
from tests.e2e.fleet import add_kubeletless_node, gpu_pod, mi210_with_synthetic_vram, remove_kubeletless_node, wait_for

pytestmark = pytest.mark.e2e

NAMESPACE = "failover"
LABEL = "rocshare-failover"
NODES = 2  # MI210 captures: 8 GPUs of 104 CUs each
PODS_PER_BURST = 36
KILL_AFTER = 12
CREATE_GAP_S = 0.1
RUNNING_DEADLINE_S = 90.0
GATE_NODE = "failover-gate"
"""No kubelet: a pod bound there stays in flight, so a second pod's bind waits behind it."""
HELD_BIND_S = 20.0
"""A held bind must still be waiting at the kill: the extender gives up after 25 s (binder.py)."""


@dataclass
class Pair:
    replicas: list[OperatorReplica]

    def leader(self) -> OperatorReplica | None:
        leading = [replica for replica in self.replicas if replica.leading()]
        assert len(leading) <= 1, f"{len(leading)} replicas decide at once"
        return leading[0] if leading else None


@pytest.fixture(scope="module")
def pair(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("failover")
    os.kill(cluster.pids["kube-scheduler"], signal.SIGSTOP)
    cluster.kubectl("create", "namespace", NAMESPACE)
    install_peering(cluster)
    replicas = [OperatorReplica(cluster, f"rocshare-operator-{letter}") for letter in "ab"]
    pool = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "failover"},
            "spec": {"nodeSelector": {"rocshare.io/sim": "failover"}}}
    gate_pool = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "failover-gate"},
                 "spec": {"nodeSelector": {"rocshare.io/sim": "failover-gate"}}}
    sysfs = mi210_with_synthetic_vram(sysfs_fixtures, work)
    nodes = [SimulatedNode(name=f"failover-{index}", kubeconfig=cluster.kubeconfig, work_dir=work, sysfs_root=sysfs,
                           labels={"rocshare.io/sim": "failover"}) for index in range(NODES)]
    try:
        for replica in replicas:
            replica.start()
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool))
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(gate_pool))
        # The policies once their parameters name these pools only: a binding made while the
        # ConfigMap still named an earlier module's pool went on using it.
        replicas[0].operator.wait_admission_params()
        replicas[0].operator.install_admission_policies()
        for node in nodes:
            node.start()
        yield Pair(replicas)
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0", check=False)
        cluster.kubectl("delete", "amdgpupool", "failover", "failover-gate", "--ignore-not-found", "--timeout=30s",
                        check=False)
        for node in nodes:
            node.stop()
        cluster.kubectl("delete", "amdgpunode", GATE_NODE, "--ignore-not-found", check=False)
        for replica in replicas:
            replica.delete()
        replicas[0].operator.stop()  # removes the admission policies
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        os.kill(cluster.pids["kube-scheduler"], signal.SIGCONT)


def slice_pod(name: str) -> dict:
    pod = gpu_pod(name, namespace=NAMESPACE, gpu="1", gpumem="2048", gpucores="10",
                  node_selector={"rocshare.io/pool": "failover"})
    pod["metadata"]["labels"] = {LABEL: "1"}
    pod["spec"]["schedulerName"] = "rocshare-scheduler"
    return pod


def gate_pod(name: str) -> dict:
    pod = gpu_pod(name, namespace=NAMESPACE, gpu="1", gpumem="1024", gpucores="10",
                  node_selector={"kubernetes.io/hostname": GATE_NODE})
    pod["spec"]["schedulerName"] = "rocshare-scheduler"
    return pod


async def hold_a_bind_open(kube: Kube, leader: OperatorReplica, prefix: str) -> float:
    """A pod in flight on the gate node, a second pod's bind waiting behind it in `leader`, seen
    under way by the leader's kube-scheduler (nothing else is pending); returns when that was seen."""
    await kube.create(object_path("v1", "pods", namespace=NAMESPACE), gate_pod(f"{prefix}-gate-first"))
    await wait_for(lambda: _bound(kube, f"{prefix}-gate-first"), timeout_s=30, what="the first gate pod bound")
    await wait_for(lambda: asyncio.to_thread(lambda: leader.binds_under_way() == 0 or None), timeout_s=30,
                   what="no bind under way")
    await kube.create(object_path("v1", "pods", namespace=NAMESPACE), gate_pod(f"{prefix}-gate-second"))
    await wait_for(lambda: asyncio.to_thread(lambda: leader.binds_under_way() >= 1 or None), timeout_s=15,
                   what="the second gate pod's bind under way in the leader's kube-scheduler")
    return time.monotonic()


async def _bound(kube: Kube, name: str) -> bool:
    return bool((await kube.get(object_path("v1", "pods", name, namespace=NAMESPACE)))["spec"].get("nodeName"))


async def release_the_held_bind(kube: Kube, prefix: str) -> None:
    """The successor keeps the second gate pod back (kube-scheduler says why), binds it once the
    first is admitted (the test plays the kubelet's status write), and the gate pods go."""
    first, second = f"{prefix}-gate-first", f"{prefix}-gate-second"
    await wait_bind_refused_behind(lambda: kube.get(object_path("v1", "pods", second, namespace=NAMESPACE)),
                                   lambda: scheduling_events(kube, NAMESPACE, second), f"{NAMESPACE}/{first}",
                                   timeout_s=90)
    await kube.merge_patch(object_path("v1", "pods", first, namespace=NAMESPACE) + "/status",
                           {"status": {"startTime": "2026-01-01T00:00:00Z"}})
    await wait_for(lambda: _bound(kube, second), timeout_s=60, what="the second gate pod bound")
    for name in (first, second):
        await kube.request("DELETE", object_path("v1", "pods", name, namespace=NAMESPACE),
                           body={"gracePeriodSeconds": 0})


async def burst(kube: Kube, prefix: str, kill, held_since: float, leader: OperatorReplica) -> list[str]:
    """Create the burst's pods one by one; after KILL_AFTER of them, with the held bind still
    waiting and the leader's kube-scheduler counting a bind under way, call `kill`. Every creation
    must succeed (a refusal raises)."""
    names = []
    for index in range(PODS_PER_BURST):
        if index == KILL_AFTER:
            assert time.monotonic() - held_since < HELD_BIND_S, "the held bind may have given up before the kill"
            assert await asyncio.to_thread(leader.binds_under_way) >= 1, "no bind under way at the kill"
            await asyncio.to_thread(kill)
        pod = slice_pod(f"{prefix}-{index:03d}")
        await kube.create(object_path("v1", "pods", namespace=NAMESPACE), pod)
        names.append(pod["metadata"]["name"])
        await asyncio.sleep(CREATE_GAP_S)
    return names


async def all_running(kube: Kube, names: list[str]) -> dict[str, str]:
    pods = (await kube.list(object_path("v1", "pods", namespace=NAMESPACE), labelSelector=f"{LABEL}=1"))["items"]
    phases = {pod["metadata"]["name"]: pod.get("status", {}).get("phase") for pod in pods}
    failed = {name: phase for name, phase in phases.items() if phase == "Failed"}
    assert not failed, f"pods failed: {failed}"
    return phases if all(phases.get(name) == "Running" for name in names) else {}


async def leaders_in_peering(kube: Kube) -> list[str]:
    status = (await kube.get(object_path("kopf.dev/v1", "clusterkopfpeerings", "rocshare"))).get("status") or {}
    return [peer for peer, entry in status.items() if (entry or {}).get("priority", 0) >= LEADER_PRIORITY]


async def run_burst_with_kill(kube: Kube, pair: Pair, prefix: str, how: str) -> OperatorReplica:
    leader = await wait_for(lambda: asyncio.to_thread(pair.leader), timeout_s=30, what="one leading replica")
    await wait_for(lambda: _inventories_published(kube), timeout_s=60, what="both nodes' GPUs published")
    await ensure_gate_node(kube)
    evidence = PodEvidence(kube, f"{LABEL}=1")
    lease = LeaseLog(kube, "rocshare-system", LEASE)
    checking = [asyncio.create_task(evidence.run()), asyncio.create_task(lease.run())]
    await asyncio.wait_for(evidence.synced.wait(), 30)
    try:
        held_since = await hold_a_bind_open(kube, leader, prefix)
        names = await burst(kube, prefix, leader.crash if how == "sigkill" else leader.delete, held_since, leader)
        await release_the_held_bind(kube, prefix)
        await wait_for(lambda: all_running(kube, names), timeout_s=RUNNING_DEADLINE_S,
                       what=f"every pod of the {how} burst Running")
        await wait_for(lambda: _admitted(evidence, names), timeout_s=10, what="every pod seen admitted")
    finally:
        await stop_tasks(checking)  # an error of the checker fails the test
    assert not evidence.violations, "\n".join(evidence.violations[:20])
    found = [binding for binding in await bindings(kube, [NAMESPACE], "rocshare-scheduler")
             if binding.pod.startswith(f"{NAMESPACE}/{prefix}-")]
    assert len(found) >= len(names), f"{len(found)} Scheduled events for {len(names)} pods"
    assert not deciders_against_lease(found, lease), deciders_against_lease(found, lease)
    assert {binding.host for binding in found} == {replica.name for replica in pair.replicas}, \
        "the burst was not bound by both replicas (before and after the kill)"
    assert not evidence.failed, f"failed pods: {evidence.failed}"
    successor = pair.leader()
    assert successor is not None and successor is not leader, "the surviving replica does not decide"
    assert len(await leaders_in_peering(kube)) == 1, "Kopf peering has not exactly one leader"
    return leader


async def _inventories_published(kube: Kube) -> bool:
    items = (await kube.list(object_path(API_VERSION, "amdgpunodes")))["items"]
    return sum(bool((obj.get("status") or {}).get("gpus")) for obj in items
               if obj["metadata"]["name"].startswith("failover-") and obj["metadata"]["name"] != GATE_NODE) == NODES


async def _admitted(evidence: PodEvidence, names: list[str]) -> bool:
    return {f"{NAMESPACE}/{name}" for name in names} <= evidence.admitted


async def ensure_gate_node(kube: Kube) -> None:
    """The node with no kubelet (one GPU copied from a simulated node's inventory)."""
    try:
        await kube.get(object_path("v1", "nodes", GATE_NODE))
    except NotFound:
        template = await kube.get(object_path(API_VERSION, "amdgpunodes", "failover-0"))
        await add_kubeletless_node(kube, GATE_NODE, {"rocshare.io/sim": "failover-gate"},
                                   template["status"]["gpus"][:1])


async def test_sigkill_of_the_leader_mid_burst_refuses_nothing_and_books_nothing_twice(pair: Pair, kube: Kube) -> None:
    killed = await run_burst_with_kill(kube, pair, "kill", "sigkill")
    killed.start()  # back as the standby for the next test


async def test_graceful_stop_of_the_leader_mid_burst_hands_over(pair: Pair, kube: Kube) -> None:
    await wait_for(lambda: asyncio.to_thread(lambda: all(r.operator.pid for r in pair.replicas) or None),
                   timeout_s=5, what="both replicas up")
    started = time.monotonic()
    stopped = await run_burst_with_kill(kube, pair, "term", "graceful")
    assert time.monotonic() - started < RUNNING_DEADLINE_S + 30
    stopped.start()


async def test_a_standby_answers_no_extender_verb(pair: Pair, kube: Kube) -> None:
    """The standby's extender refuses to decide (503), so nothing routed to it could bind."""
    import urllib.error
    import urllib.request

    leader = await wait_for(lambda: asyncio.to_thread(pair.leader), timeout_s=30, what="one leading replica")
    (standby,) = [replica for replica in pair.replicas if replica is not leader]
    await wait_for(lambda: asyncio.to_thread(lambda: _ready(standby)), timeout_s=60, what="the standby synced")
    request = urllib.request.Request(f"http://127.0.0.1:{standby.extender_port}/extender/bind", method="POST",
                                     data=json.dumps({"PodName": "x", "PodNamespace": NAMESPACE, "PodUID": "u",
                                                      "Node": "failover-0"}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 503 and b"standby" in refused.value.read()


def _ready(replica: OperatorReplica) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{replica.extender_port}/readyz", timeout=2) as reply:
            return reply.status == 200 and b"standby" in reply.read()
    except OSError:
        return False
