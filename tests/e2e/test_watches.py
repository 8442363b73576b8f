"""Each kind is watched once per operator process, counted by the API server itself.

The operator runs as the e2e suite runs it (`rocshare operator --standalone`, here with its
scheduler extender, which reads pools, nodes, pods, AmdGpuNodes and quotas too). The count
is kube-apiserver's own gauge `apiserver_longrunning_requests{verb="WATCH"}` per resource,
read from its /metrics before the operator starts and once every watch the operator needs is
open: the difference is what the operator holds open. kube-controller-manager and
kube-scheduler watch many of the same kinds; their watches are in the baseline (taken as the
highest of a few samples, the operator's as the lowest, so that another client's watch
reconnecting during a sample cannot fake a second watch).

Fails on main before issue 34's end: AmdGpuPools were watched by Kopf (the pool daemons and
finalizer) and by the extender's own Informer -- 2.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rocshare_dev.devcluster.controlplane import ControlPlane, free_port
from tests.e2e.test_operator import AGENT_NAMESPACE, ROCSHARE

pytestmark = pytest.mark.e2e

OPERATOR_KINDS = ("nodes", "pods", "amdgpunodes", "resourcequotas", "amdgpupools", "amdgpushares", "daemonsets")
"""What the operator must watch (the extender's caches, the reconcilers, Kopf's share loops and
the agent DaemonSets): each must show up once, so that the count is not vacuous."""
OPEN_WITHIN_S = 60.0
SAMPLES = 3


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


def sampled(cluster: ControlPlane, pick) -> Counter[str]:
    """Per resource, `pick` (max or min) of SAMPLES readings half a second apart."""
    readings = []
    for index in range(SAMPLES):
        if index:
            time.sleep(0.5)
        readings.append(watch_counts(cluster))
    kinds = set().union(*readings)
    return Counter({kind: pick(reading[kind] for reading in readings) for kind in kinds})


def by_resource(counts: Counter[str]) -> dict[str, int]:
    return {key.split("/", 1)[1]: value for key, value in counts.items() if value}


@pytest.fixture
def operator_process(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path, Counter[str]]]:
    """The operator, started after the baseline of open watches is taken (which it yields too)."""
    cluster.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
    baseline = sampled(cluster, max)
    log_path = tmp_path / "operator.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(
            [str(ROCSHARE), "operator", "--kubeconfig", str(cluster.kubeconfig), "--namespace", AGENT_NAMESPACE,
             "--standalone", "--no-webhook", "--extender-host", "127.0.0.1", "--extender-port", str(free_port()),
             "--metrics-port", str(free_port())],
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


async def test_the_operator_watches_each_kind_once(cluster: ControlPlane, operator_process) -> None:
    process, log_path, baseline = operator_process
    deadline = time.monotonic() + OPEN_WITHIN_S
    while True:
        assert process.poll() is None, log_path.read_text()[-4000:]
        opened = by_resource(watch_counts(cluster) - baseline)
        if all(opened.get(kind, 0) >= 1 for kind in OPERATOR_KINDS):
            break
        assert time.monotonic() < deadline, f"the operator's watches did not all open: {opened}"
        await asyncio.sleep(0.5)
    await asyncio.sleep(3.0)  # any second watch of a kind would be open by now
    held = by_resource(sampled(cluster, min) - baseline)
    assert set(OPERATOR_KINDS) <= set(held), held
    print(f"open WATCH requests the operator holds, per resource: {held}")
    twice = {kind: count for kind, count in held.items() if count > 1}
    assert not twice, f"kinds the operator watches more than once: {twice} (all: {held})"
