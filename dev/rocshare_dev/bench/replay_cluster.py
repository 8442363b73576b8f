"""The real half of `rocshare-dev bench replay` (replay.py): a local control plane with the
manifests' kube-scheduler profile, the operator (extender and webhooks), an AmdGpuPool with the
policy under test, the trace's nodes, and the pods one at a time.

Nodes: one `kubelet-peer --node-count` per (CPU, memory) class of the sample (the peer sets one
capacity per process), named ``rp<class>-<n>``, and one agents process for all of them
(`devcluster.multiagent --sysfs-map`), each node reading a resized MI210 capture with its GPU
count and its model's VRAM (`devcluster.captures.mi210_resized`).

Pods: created in the sequence's order; the next is created once this one's decision is read
(the pod is polled, see `_decided`): bound (spec.nodeName) or Unschedulable (condition PodScheduled False, reason
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
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from rocshare.api.models import API_VERSION
from rocshare.kube.client import ApiError, Kube, Unavailable, object_path
from rocshare_dev.bench.replay import CU_COUNT, NAMESPACE, POOL, SCHEDULER, SIM_LABEL, Outcome
from rocshare_dev.bench.simulation import DEFAULT_VRAM_MIB, MODEL_VRAM_MIB
from rocshare_dev.bench.trace import TraceNode, TracePod
from rocshare_dev.devcluster.captures import FIXTURES, mi210_resized
from rocshare_dev.devcluster.controlplane import DEFAULT_BIN_DIR, PROJECT_ROOT, ControlPlane, Ports, stop_process
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simfleet import make_dev_tree, offered


def run_real(subset: Sequence[TraceNode], sequence: Sequence[TracePod], *, policy: str, scheduling: dict[str, str],
             decision_timeout_s: float, work_dir: Path | None, keep: bool, mode: str = "extender") -> dict[str, Any]:
    """The real run in `mode`: "extender" (this module's `_run`) or "dra" (replay_dra.run_dra: DRA
    mode on a 1.37 control plane, the same nodes and pods); the same figures either way."""
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="rocshare-replay-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM too stops what the run started
    try:
        if mode == "dra":
            from rocshare_dev.bench.replay_dra import WHAT, run_dra

            result, what = asyncio.run(run_dra(root, subset, sequence, decision_timeout_s)), WHAT
        else:
            result, what = asyncio.run(_run(root, subset, sequence, scheduling, decision_timeout_s)), WHAT_EXTENDER
    except BaseException:
        print(f"rocshare-dev bench replay: failed; logs kept in {root}", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    result.update({"policy": policy, "mode": mode, "wall_s": round(time.monotonic() - started, 1), "what": what})
    return result


WHAT_EXTENDER = ("real kube-apiserver, kube-scheduler (manifests' profile) and extender; "
                 "kubelet-peer nodes and rocshare agents")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


async def _run(root: Path, subset: Sequence[TraceNode], sequence: Sequence[TracePod], scheduling: dict[str, str],
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
            result = await _submit(kube, fleet, sequence, decision_timeout_s)
            result["nodes_ready_s"] = round(setup_s, 1)
            return result
    finally:
        fleet.stop()
        operator.stop()
        cluster.stop()


REPLAY_BACKOFFS = {"podInitialBackoffSeconds": 60, "podMaxBackoffSeconds": 600}


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


def pod_object(pod: TracePod, serial: int) -> dict[str, Any]:
    """A trace pod as a user would write it (mapping in replay.py's docstring)."""
    limits: dict[str, str] = {}
    if pod.num_gpu:
        limits["amd.com/gpu"] = str(pod.num_gpu)
        if pod.gpu_milli < 1000:
            limits["amd.com/gpucores"] = limits["amd.com/gpumem-percentage"] = str(pod.gpu_milli // 10)
    resources: dict[str, Any] = {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}
    if limits:
        resources["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{serial:05d}", "namespace": NAMESPACE, "labels": {"trace-pod": pod.name[:63]}},
            "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "trace", "resources": resources}]}}


# ---- nodes -------------------------------------------------------------------------------------


def node_classes(subset: Sequence[TraceNode]) -> list[tuple[tuple[int, int], list[TraceNode]]]:
    """The sample's nodes by (CPU milli, memory MiB), in order: a kubelet peer sets one capacity."""
    classes: dict[tuple[int, int], list[TraceNode]] = defaultdict(list)
    for node in subset:
        classes[(node.cpu_milli, node.memory_mib)].append(node)
    return sorted(classes.items())


def node_names(subset: Sequence[TraceNode]) -> dict[str, TraceNode]:
    """Cluster node name -> trace node: ``rp<class>-<n>``, the same in both modes of the replay."""
    return {f"rp{number:02d}-{index:04d}": node
            for number, (_, members) in enumerate(node_classes(subset)) for index, node in enumerate(members)}


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


# ---- pods --------------------------------------------------------------------------------------


class _Decisions:
    """What the watch has shown of each pod: bound to a node, or unschedulable with a message."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}
        self.unschedulable: dict[str, str] = {}

    def see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            self.bound[name] = node
        else:
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                        and condition.get("reason") == "Unschedulable"):
                    self.unschedulable.setdefault(name, condition.get("message") or "")



async def _submit(kube: Kube, fleet: TraceFleet, sequence: Sequence[TracePod], decision_timeout_s: float,
                  *, start: int = 0, pod_of: Callable[[TracePod, int], dict[str, Any]] = pod_object) -> dict[str, Any]:
    """The pods one at a time, each decision awaited; `fleet` is anything with the node map
    (`nodes`) and `check_alive()`; `pod_of` writes trace pod `serial` as the mode wants it."""
    capacity = sum(node.gpus for node in fleet.nodes.values()) * 1000
    outcome = Outcome(capacity)
    decisions = _Decisions()
    path = object_path("v1", "pods", namespace=NAMESPACE)
    if start:  # resuming: the decisions of pods created before
        for pod in (await kube.list(path)).get("items", []):
            decisions.see(pod)
        for serial in range(start):
            node = decisions.bound.get(f"p{serial:05d}")
            outcome.add(sequence[serial], fleet.nodes[node].name if node in fleet.nodes else None)
    latencies: list[float] = []
    started = time.monotonic()
    for serial in range(start, len(sequence)):
        pod = sequence[serial]
        body = pod_of(pod, serial)
        name = body["metadata"]["name"]
        begun = time.monotonic()
        await _create(kube, path, body)
        await _decided(kube, fleet, decisions, name, serial, decision_timeout_s)
        latencies.append(time.monotonic() - begun)
        node = decisions.bound.get(name)
        outcome.add(pod, fleet.nodes[node].name if node in fleet.nodes else None)
        if serial % 250 == 0:
            print(f"replay: {serial}/{len(sequence)} pods, {time.monotonic() - started:.0f} s, "
                  f"allocated {100.0 * outcome.allocated / capacity:.2f} %", file=sys.stderr, flush=True)
    replay_s = time.monotonic() - started
    await asyncio.sleep(5.0)  # late binds, if any, show up in the final list
    return {**outcome.summary(), **_final(sequence, await kube.list(path), decisions, capacity),
            "replay_s": round(replay_s, 1), "pods_per_s": round((len(sequence) - start) / replay_s, 1),
            "decision_ms": _percentiles(latencies)}


async def _decided(kube: Kube, fleet: TraceFleet, decisions: _Decisions, name: str, serial: int,
                   timeout_s: float) -> None:
    """Poll the pod until it is bound or Unschedulable. Not a namespace watch: once hundreds of
    pods wait, kube-scheduler rewrites their status on every retry, and a watch of the namespace
    falls minutes behind that stream."""
    path = object_path("v1", "pods", name, namespace=NAMESPACE)
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while time.monotonic() < deadline:
        try:
            decisions.see(await kube.get(path))
        except (ApiError, TimeoutError):
            pass
        if name in decisions.bound or name in decisions.unschedulable:
            return
        await asyncio.sleep(pause)
        pause = min(0.2, pause * 1.5)
    fleet.check_alive()
    raise RuntimeError(f"pod {name} (serial {serial}): no decision within {timeout_s:.0f} s")


async def _create(kube: Kube, path: str, body: dict[str, Any]) -> None:
    for attempt in range(5):
        try:
            await kube.create(path, body)
            return
        except Unavailable:
            await asyncio.sleep(1.0 + attempt)
        except ApiError as error:
            if getattr(error, "status", 0) == 409:  # created by an attempt whose answer was lost
                return
            raise


def _final(sequence: Sequence[TracePod], listed: dict[str, Any], decisions: _Decisions,
           capacity: int) -> dict[str, Any]:
    """The figure from a fresh list: GPU-milli of the pods bound by the end; why the rest wait."""
    by_name = {f"p{serial:05d}": pod for serial, pod in enumerate(sequence)}
    bound = {pod["metadata"]["name"] for pod in listed.get("items", []) if (pod.get("spec") or {}).get("nodeName")}
    allocated = sum(by_name[name].gpu_milli_total for name in bound if name in by_name)
    reasons: Counter[str] = Counter()
    for pod in listed.get("items", []):
        if pod["metadata"]["name"] not in bound:
            reasons[_reason(decisions.unschedulable.get(pod["metadata"]["name"], "no decision seen"))] += 1
    example = next((message for name, message in decisions.unschedulable.items() if name not in bound), None)
    return {"final_allocation_ratio": round(100.0 * allocated / capacity, 3), "bound_at_end": len(bound),
            "pending_at_end": len(sequence) - len(bound),
            "late_binds": len(bound & set(decisions.unschedulable)),
            "pending_reasons": dict(reasons.most_common(8)), "pending_example": example}


def _reason(message: str) -> str:
    """The kinds of reasons in kube-scheduler's message, counts left out: "0/304 nodes are
    available: 170 Insufficient cpu, 34 2/2 ExclusiveDeviceAllocateConflict, ... preemption: ..."
    -> "ExclusiveDeviceAllocateConflict, Insufficient cpu" (for a summary by kind)."""
    detail = message.split(": ", 1)[-1].split(". preemption:", 1)[0].split(". no new claims", 1)[0]
    kinds = set()
    for part in detail.replace(".", ",").split(","):
        words = [word for word in part.split() if not word[0].isdigit()]
        if words:
            kinds.add(" ".join(words))
    return ", ".join(sorted(kinds)) or message[:120]


def _percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(1000 * pick(0.5), 1), "p99": round(1000 * pick(0.99), 1), "max": round(1000 * ordered[-1], 1)}
