"""Chaos with poisoned objects (issue 16): the operator runs with planted faults
(rocshare_dev.devcluster.faults) on the real control plane, kube-scheduler and a simulated MI210
node (kubelet device manager + agent; the capture copied with a synthetic 64 GiB per GPU):

* a handler made to raise: the extender's accounting raises on the first 5 events of pod
  `flaky-1`; the event is retried until it is taken, and meanwhile the failure shows on /readyz
  (503 naming the pod), on the metrics (`rocshare_watch_event_failures`) and in the pool's
  Degraded condition (EventsNotHandled);
* a pod object the fact decoder chokes on (`choke-1`);
* a pod whose allocation record is valid JSON of the wrong shape (`victim`, rewritten by the
  cluster admin after it ran).
After the operator restarts (it rebuilds everything from watches), the two pods it cannot read
keep their node blocked: a new pod waits with UndecodableAllocationRecord, never bound there,
`rocshare_unaccountable_pods` counts them and each gets an UnaccountableAllocation event; once they are deleted, the node takes the pod. No GPU
is handed out twice at any point (the chaos test's own invariants, from every decodable record).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from tests.e2e.fleet import (
    create_pod,
    delete_pod,
    gpu_pod,
    mi210_with_synthetic_vram,
    one_pool_one_node,
    read_pod,
    scheduling_failures,
    wait_for,
    wait_running,
)
from tests.e2e.test_chaos import capacities, gpu_violations, holding

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

NODE = "poison-mi210"
NAMESPACE = "poison"
RAISES = 5  # 0.1 + 0.5 + 1 + 2 + 5 s of retries: long enough to see readiness and the pool's condition
FAULTS = (sys.executable, "-m", "rocshare_dev.devcluster.faults", "--choke-facts", "choke-",
          "--raise", f"flaky-:{RAISES}", "--")
WRONG_SHAPE = json.dumps({"version": 1, "node": NODE, "containers": "every GPU"})


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("poison")
    cluster.kubectl("create", "namespace", NAMESPACE)
    operator = OperatorProcess(cluster, command=FAULTS)
    with one_pool_one_node(cluster, pool=NODE, sharing={}, node=NODE, work_dir=work, operator=operator,
                           sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, work)):
        try:
            yield operator
        finally:
            cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0",
                            "--wait=false", check=False)


def pod(name: str) -> dict:
    body = gpu_pod(name, namespace=NAMESPACE, gpu="1", node_selector={"rocshare.io/pool": NODE})
    body["spec"]["terminationGracePeriodSeconds"] = 0
    return body


def readiness(operator: OperatorProcess) -> tuple[int, str]:
    url, context = operator.readyz()
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if all(found.get(key) == value for key, value in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def double_bookings(kube: Kube) -> list[str]:
    """The chaos test's invariants over every decodable record on the node's GPUs."""
    pods = (await kube.list(object_path("v1", "pods", namespace=NAMESPACE))).get("items", [])
    gpu_nodes = [await kube.get(object_path(API_VERSION, "amdgpunodes", NODE))]
    held, _unreadable = holding(pods)
    return gpu_violations(capacities(gpu_nodes), held)


async def test_poisoned_objects_block_their_node_and_nothing_is_booked_twice(fleet, kube: Kube) -> None:
    operator = fleet

    async def offers() -> bool:
        node = await kube.get(object_path("v1", "nodes", NODE))
        return node.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0") != "0"
    await wait_for(offers, timeout_s=60, what="the node's allocatable amd.com/gpu")

    # A handler that raises: retried until taken, visible on readiness and metrics meanwhile.
    failures_before = metric(operator, "rocshare_watch_event_failures_total", watch="pods")
    await create_pod(kube, pod("flaky-1"))
    seen_failing = seen_condition = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (seen_failing is None or seen_condition is None):
        status, text = readiness(operator)
        if status == 503 and f"{NAMESPACE}/flaky-1" in text:
            seen_failing = text
        conditions = ((await kube.get(object_path(API_VERSION, "amdgpupools", NODE))).get("status") or {}).get(
            "conditions") or []
        for condition in conditions:
            if condition["type"] == "Degraded" and f"{NAMESPACE}/flaky-1" in condition.get("message", ""):
                seen_condition = condition
        await asyncio.sleep(0.05)
    assert seen_failing is not None, "readiness never reported the failing handler"
    assert "planted: accounting failed" in seen_failing
    assert seen_condition is not None and f"{NAMESPACE}/flaky-1" in seen_condition["message"], seen_condition
    await wait_running(kube, "flaky-1", NAMESPACE, timeout_s=60)
    await wait_for(lambda: asyncio.to_thread(lambda: readiness(operator)[0] == 200), timeout_s=30,
                   what="readiness back once the event was taken")
    assert metric(operator, "rocshare_watch_event_failures_total", watch="pods") >= failures_before + RAISES
    assert metric(operator, "rocshare_watch_events_failing", watch="pods") == 0

    # Two pods the operator will not be able to read, running on the node.
    # (choke-1 last: a pod the operator cannot read never leaves the node's in-flight gate, so no
    # other pod is bound there after it until it is gone -- blocked, as its GPUs are.)
    await create_pod(kube, pod("victim"))
    await wait_running(kube, "victim", NAMESPACE, timeout_s=60)
    await create_pod(kube, pod("choke-1"))
    await wait_running(kube, "choke-1", NAMESPACE, timeout_s=60)
    assert await double_bookings(kube) == []
    # The admin (trusted by the webhook) rewrites the victim's record: valid JSON, wrong shape.
    await kube.merge_patch(object_path("v1", "pods", "victim", namespace=NAMESPACE),
                           {"metadata": {"annotations": {ALLOCATION_ANNOTATION: WRONG_SHAPE}}})

    # The operator restarts and rebuilds from watches: both pods' holds are unknown.
    operator.kill()
    operator.start()
    await wait_for(lambda: asyncio.to_thread(
        lambda: metric(operator, "rocshare_unaccountable_pods", namespace=NAMESPACE, node=NODE) == 2),
        timeout_s=30, what="two unaccountable pods on the node in the metrics")

    async def warned(name: str) -> list[str]:
        events = await kube.list(object_path("v1", "events", namespace=NAMESPACE),
                                 fieldSelector=f"involvedObject.name={name},reason=UnaccountableAllocation")
        return [event["message"] for event in events.get("items", [])]
    for name, why in (("victim", "is invalid"), ("choke-1", "its object cannot be read")):
        messages = await wait_for(lambda name=name: warned(name), timeout_s=20, what=f"an event on {name}")
        assert any(why in message and f"node {NODE} takes no new pods" in message for message in messages), messages

    await create_pod(kube, pod("intruder"))
    failures = await wait_for(lambda: scheduling_failures(kube, "intruder", NAMESPACE), timeout_s=30,
                              what="a FailedScheduling event for the intruder")
    assert any("UndecodableAllocationRecord" in message for message in failures), failures
    for _ in range(10):  # the node stays blocked: the intruder is never bound there, nothing is booked twice
        intruder = await read_pod(kube, "intruder", NAMESPACE)
        assert not intruder["spec"].get("nodeName"), "bound to a node whose GPUs could not be accounted for"
        assert await double_bookings(kube) == []
        await asyncio.sleep(0.5)

    # Once the pods nobody can read are gone, their GPUs are free again.
    await delete_pod(kube, "victim", NAMESPACE)
    await delete_pod(kube, "choke-1", NAMESPACE)
    await wait_running(kube, "intruder", NAMESPACE, timeout_s=90)
    assert metric(operator, "rocshare_unaccountable_pods", namespace=NAMESPACE, node=NODE) == 0
    assert await double_bookings(kube) == []
