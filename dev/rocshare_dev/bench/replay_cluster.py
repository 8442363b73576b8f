"""The real half of `rocshare-dev bench replay` (replay.py): a local control plane with the
manifests' kube-scheduler profile, the operator (extender and webhooks), an AmdGpuPool with the
policy under test, the trace's nodes, and the pods one at a time.

Nodes: one `kubelet-peer --node-count` per (CPU, memory) class of the sample (the peer sets one
capacity per process), named ``rp<class>-<n>``, and one agents process for all of them
(`devcluster.multiagent --sysfs-map`), each node reading a resized MI210 capture with its GPU
count and its model's VRAM (`devcluster.captures.mi210_resized`).

Pods: created in the sequence's order by `replay_common.submit` (shared with DRA mode); the next
is created once this one's decision is read (the pod is polled): bound (spec.nodeName) or Unschedulable (condition PodScheduled False, reason
Unschedulable, whose message carries the extender's per-node reasons). Pods that fit nowhere
stay Pending, as a user's would (kube-scheduler keeps retrying them, with the longer backoff
of `_scheduler_config`). At the end the pods are
listed afresh: the figure counts every pod bound by then (`late_binds`: pods first reported
unschedulable and bound later; with no departures there should be none).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, Unavailable, object_path
from rocshare_dev.bench.replay_common import CU_COUNT, NAMESPACE, POOL, REPLAY_BACKOFFS, SIM_LABEL, node_classes, \
    node_names, submit
from rocshare_dev.bench.simulation import DEFAULT_VRAM_MIB, MODEL_VRAM_MIB
from rocshare_dev.bench.trace import TraceNode, TracePod
from rocshare_dev.devcluster.captures import FIXTURES, mi210_resized
from rocshare_dev.devcluster.controlplane import DEFAULT_BIN_DIR, PROJECT_ROOT, ControlPlane, Ports, stop_process
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simfleet import make_dev_tree, offered
WHAT = ("real kube-apiserver, kube-scheduler (manifests' profile) and extender; "
                 "kubelet-peer nodes and rocshare agents")


async def run_extender(root: Path, subset: Sequence[TraceNode], sequence: Sequence[TracePod], scheduling: dict[str, str],
               decision_timeout_s: float) -> dict[str, Any]:
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), with_scheduler=False)
    operator = OperatorProcess(cluster)
    fleet = TraceFleet(cluster.kubeconfig, root / "nodes", subset)
    try:
        cluster.start()
        cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        operator.start()
        operator.install_webhooks()
        async with await Kube.connect(cluster.kubeconfig) as kube:
            await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            await kube.create(object_path(API_VERSION, "amdgpupools"), _pool(scheduling))
            cluster.start_scheduler(config_path=_scheduler_config(cluster))
            setup_started = time.monotonic()
            fleet.start()
            await _wait_inventories(kube, fleet, deadline_s=300)
            setup_s = time.monotonic() - setup_started
            result = await submit(kube, fleet, sequence, decision_timeout_s)
            result["nodes_ready_s"] = round(setup_s, 1)
            return result
    finally:
        fleet.stop()
        operator.stop()
        cluster.stop()


def _scheduler_config(cluster: ControlPlane) -> Path:
    """The manifests' profile with longer retry backoffs (60 s, at most 600 s): with no departures
    a pod that found no room never finds it later, and hundreds of Pending pods retried every 1-10 s
    kept kube-scheduler from the next arrival for minutes. Scoring is the profile's, unchanged."""
    config = yaml.safe_load(cluster._write_scheduler_config().read_text())
    config.update(REPLAY_BACKOFFS)
    path = cluster.root / "kube-scheduler-replay.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _pool(scheduling: dict[str, str]) -> dict[str, Any]:
    # Health every hour: hundreds of nodes' device-file checks would only be noise here.
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
            "spec": {"nodeSelector": dict(SIM_LABEL), "scheduling": dict(scheduling),
                     "health": {"intervalSeconds": 3600}}}


# ---- nodes -------------------------------------------------------------------------------------


class TraceFleet:
    """The sample's nodes: a kubelet peer per (CPU, memory) class, one agents process."""

    def __init__(self, kubeconfig: Path, work_dir: Path, subset: Sequence[TraceNode]) -> None:
        self.kubeconfig, self.work_dir = kubeconfig, work_dir
        self.classes = node_classes(subset)
        self.nodes = node_names(subset)
        self.processes: dict[str, subprocess.Popen] = {}
        self.plugin_root = Path(tempfile.mkdtemp(prefix="rocshare-rp-"))  # short: socket paths <= 107 bytes

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        labels = ",".join(f"{key}={value}" for key, value in SIM_LABEL.items())
        for number, ((cpu_milli, memory_mib), members) in enumerate(self.classes):
            self._spawn(f"peer-{number:02d}", [
                str(DEFAULT_BIN_DIR / "kubelet-peer"), f"--kubeconfig={self.kubeconfig}", f"--node-count={len(members)}",
                f"--node-name-prefix=rp{number:02d}-", f"--plugin-root={self.plugin_root}", f"--labels={labels}",
                f"--cpu={cpu_milli}m", f"--memory={memory_mib}Mi", "--pods=1000", "--heartbeat-interval=60s",
                "--multi-qps=500"])
        captures = self.work_dir / "captures"
        roots = {name: str(mi210_resized(FIXTURES, captures, gpus=node.gpus, cu_count=CU_COUNT,
                                         vram_mib=MODEL_VRAM_MIB.get(node.model, DEFAULT_VRAM_MIB)))
                 for name, node in self.nodes.items()}
        (self.work_dir / "sysfs-map.json").write_text(json.dumps(roots))
        full = mi210_resized(FIXTURES, captures, gpus=8, cu_count=CU_COUNT, vram_mib=DEFAULT_VRAM_MIB)
        dev_root = make_dev_tree(full, self.work_dir / "dev")
        self._spawn("agents", [sys.executable, "-m", "rocshare_dev.devcluster.multiagent",
                               f"--kubeconfig={self.kubeconfig}", f"--plugin-root={self.plugin_root}",
                               f"--sysfs-root={full}", f"--sysfs-map={self.work_dir / 'sysfs-map.json'}",
                               f"--dev-root={dev_root}", "--health-interval-s=3600", "--heartbeat-s=600",
                               "--log-level=WARNING", *self.nodes])

    def check_alive(self) -> None:
        for what, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited ({process.returncode}); see {self.work_dir / (what + '.log')}")

    def stop(self) -> None:
        for what in ["agents", *sorted(name for name in self.processes if name != "agents")]:
            process = self.processes.pop(what, None)
            if process is not None:
                stop_process(process.pid, what)
                process.wait(timeout=5)
        shutil.rmtree(self.plugin_root, ignore_errors=True)

    def _spawn(self, what: str, command: list[str]) -> None:
        with open(self.work_dir / f"{what}.log", "ab") as log:
            self.processes[what] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _wait_inventories(kube: Kube, fleet: TraceFleet, *, deadline_s: float) -> None:
    """Every node Ready with allocatable amd.com/gpu, and every AmdGpuNode published with the
    node's GPU count and its device plugin watched (the extender decides from these)."""
    deadline = time.monotonic() + deadline_s
    wanted = {name: node.gpus for name, node in fleet.nodes.items()}
    while time.monotonic() < deadline:
        fleet.check_alive()
        try:
            nodes = (await kube.list(object_path("v1", "nodes"), labelSelector=_selector())).get("items", [])
            items = (await kube.list(object_path(API_VERSION, "amdgpunodes"))).get("items", [])
        except (Unavailable, TimeoutError):  # hundreds of agents registering at once: a busy server
            await asyncio.sleep(2.0)
            continue
        allocatable = {n["metadata"]["name"] for n in nodes
                       if int((n.get("status", {}).get("allocatable") or {}).get("amd.com/gpu", "0")) > 0}
        published = {i["metadata"]["name"] for i in items
                     if len((i.get("status") or {}).get("gpus") or []) == wanted.get(i["metadata"]["name"], -1)
                     and offered(i["status"])}
        if set(wanted) <= allocatable & published:
            await asyncio.sleep(3.0)  # the operator's watches deliver them a moment later
            return
        await asyncio.sleep(2.0)
    raise RuntimeError(f"nodes not ready within {deadline_s:.0f} s; see {fleet.work_dir}")


def _selector() -> str:
    return ",".join(f"{key}={value}" for key, value in SIM_LABEL.items())


