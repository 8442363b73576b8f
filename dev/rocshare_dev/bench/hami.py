"""HAMi's scheduler beside rocshare's on the `bench e2e` fleet (issue 18, item 4).

HAMi's source is not on the Go module proxy; the user hands the benchmark a checkout of
Project-HAMi/HAMi (`--hami-src DIR`, `make bench HAMI_SRC=DIR`). `build_scheduler` builds its
`cmd/scheduler` there with HAMi's own go.mod into .cache/hami/<commit>/ (cached per commit);
nothing of HAMi is copied into this project. Without a checkout the figures say "not run".

`HamiScheduler` runs that binary as HAMi's chart does: an extender (filter + bind) for a
kube-scheduler profile named `hami-scheduler`, the AMD device type on (amd.com/gpu, gpumem,
gpucores), reading the nodes' `hami.io/node-amd-register` annotation (the rocshare agents write
it in HAMi's own format) and HAMi's defaults otherwise (node lock timeout 5 min, policies
binpack/spread).

HAMi's bind takes a per-node lock (node annotation `hami.io/mutex.lock`, value
`<RFC3339 time>,<namespace>,<pod>`) before it binds, and HAMi's node side releases it: its
device plugin, in Allocate, erases the pod's `hami.io/<vendor>-devices-to-allocate` entries,
sets the pod's `hami.io/bind-phase` to `success` (`failed` when Allocate fails) and deletes
the lock annotation if this pod holds it (pkg/device-plugin/.../plugin/util.go and
pkg/util/nodelock at HAMi 4707fb0; HAMi's AMD design, docs/develop/amd-vgpu.md, gives its AMD
plugin the same protocol). Until then the node takes no other HAMi pod; a lock nobody releases
lasts `--node-lock-timeout` (5 min). Nothing of HAMi's runs on the bench's simulated nodes, so
`NodeSide` -- the BENCH HARNESS standing in for HAMi's device plugin -- does those three writes
for each pod as soon as the watch shows it bound: HAMi at its best (a real node adds the
kubelet's admission and Allocate before the release). Its decisions are pure functions
(`erased_devices_patch`, `success_patch`, `lock_release_patch`) unit-tested against HAMi's
rules. HAMi's pods cannot run on rocshare's agents (they carry no rocshare record; the agent
refuses them), so the common measure is create -> bound.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SCHEDULER_CONFIG, ControlPlane, free_port, stop_process
from rocshare.kube.client import ApiError, Conflict, Kube, object_path

CACHE = PROJECT_ROOT / ".cache" / "hami"
SCHEDULER_NAME = "hami-scheduler"
DEVICE_CONFIG = {"amd": {"resourceCountName": "amd.com/gpu", "resourceMemoryName": "amd.com/gpumem",
                         "resourceCoreName": "amd.com/gpucores"}}
MANAGED_RESOURCES = ("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores")
# HAMi's names (pkg/util/types.go, pkg/util/nodelock, pkg/device/amd at 4707fb0)
NODE_LOCK = "hami.io/mutex.lock"
LOCK_SEPARATOR = ","
BIND_PHASE = "hami.io/bind-phase"
ASSIGNED_NODE = "hami.io/vgpu-node"
DEVICES_TO_ALLOCATE = "hami.io/amd-devices-to-allocate"
CONTAINER_SEPARATOR = ";"
RELEASE_ATTEMPTS = 5  # HAMi's retry.OnError backoff has 5 steps


class HamiNotBuilt(RuntimeError):
    """HAMi's scheduler could not be built from the checkout given; the message says why."""


def commit_of(src: Path) -> str:
    """The checkout's commit: git's, else a `.hami-commit` file beside it (an archive export)."""
    result = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if result.returncode == 0 and result.stdout.strip():
        return result.stdout.strip()
    marker = src / ".hami-commit"
    return marker.read_text().strip() if marker.exists() else "unknown"


def build_scheduler(src: Path) -> Path:
    """HAMi's cmd/scheduler built with its own go.mod, cached per commit."""
    src = src.resolve()
    if not (src / "go.mod").exists() or "Project-HAMi/HAMi" not in (src / "go.mod").read_text():
        raise HamiNotBuilt(f"{src} is not a checkout of Project-HAMi/HAMi (no go.mod of that module)")
    commit = commit_of(src)
    out = CACHE / (commit[:12] if commit != "unknown" else "unknown") / "hami-scheduler"
    if out.exists() and commit != "unknown":
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["go", "build", "-o", str(out), "./cmd/scheduler"], cwd=src, capture_output=True,
                            text=True, check=False)  # as HAMi builds it (its Makefile's environment, cgo on)
    if result.returncode != 0:
        raise HamiNotBuilt(f"go build ./cmd/scheduler in {src} failed: {result.stderr.strip()[-2000:]}")
    return out


class HamiScheduler:
    """HAMi's scheduler process and the kube-scheduler that calls it (profile `hami-scheduler`)."""

    def __init__(self, cluster: ControlPlane, binary: Path, *, node_lock_timeout: str = "5m") -> None:
        self.cluster = cluster
        self.binary = binary
        self.node_lock_timeout = node_lock_timeout
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}

    def start(self, *, timeout_s: float = 60.0, nodes: int = 0, register_timeout_s: float = 300.0) -> None:
        """Start HAMi's scheduler and, once it has registered `nodes` nodes' devices, the
        kube-scheduler that calls it (a pod tried before that is found unschedulable and waits in
        kube-scheduler's unschedulable queue for minutes)."""
        root = self.cluster.root
        device_config = root / "hami-device-config.yaml"
        device_config.write_text(yaml.safe_dump(DEVICE_CONFIG))
        log_path = self.cluster.logs / "hami-scheduler.log"
        log_start = log_path.stat().st_size if log_path.exists() else 0
        self._spawn("hami-scheduler", [str(self.binary), f"--http_bind=127.0.0.1:{self.port}",
                                       f"--device-config-file={device_config}", f"--scheduler-name={SCHEDULER_NAME}",
                                       f"--metrics-bind-address=127.0.0.1:{free_port()}",
                                       f"--node-lock-timeout={self.node_lock_timeout}", "--kube-qps=500",
                                       "--kube-burst=1000", "-v=1"],
                    env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)})
        self._wait_ready(timeout_s)
        self._wait_registered(log_path, log_start, nodes, register_timeout_s)
        config = root / "kube-scheduler-hami.yaml"
        config.write_text(yaml.safe_dump(self._scheduler_config(), sort_keys=False))
        self._spawn("kube-scheduler-hami", [str(self.cluster.bin_dir / "kube-scheduler"), f"--config={config}",
                                            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=1"])

    def _scheduler_config(self) -> dict:
        """The same kube-scheduler and client settings as rocshare's, HAMi's extender instead
        (as HAMi's chart configures it: filter and bind, node cache, its resources ignored)."""
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["profiles"] = [{"schedulerName": SCHEDULER_NAME}]
        config["extenders"] = [{
            "urlPrefix": f"http://127.0.0.1:{self.port}", "filterVerb": "filter", "bindVerb": "bind",
            "nodeCacheCapable": True, "weight": 1, "httpTimeout": "30s", "enableHTTPS": False,
            "managedResources": [{"name": name, "ignoredByScheduler": True} for name in MANAGED_RESOURCES]}]
        config["clientConnection"] = {"kubeconfig": str(self.cluster.kubeconfig), "qps": 500, "burst": 1000}
        config["leaderElection"] = {"leaderElect": False}
        return config

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.processes["hami-scheduler"].poll() is not None:
                raise HamiNotBuilt(f"HAMi's scheduler exited; see {self.cluster.logs / 'hami-scheduler.log'}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise HamiNotBuilt(f"HAMi's scheduler did not answer /healthz within {timeout_s:.0f} s")

    def _wait_registered(self, log_path: Path, start: int, nodes: int, timeout_s: float) -> None:
        """Until HAMi's log says it added `nodes` nodes' devices ("Node device added", one line per
        node at -v=1): its node registration loop reads every node's hami.io/node-amd-register."""
        deadline, seen = time.monotonic() + timeout_s, 0
        while nodes and time.monotonic() < deadline:
            with open(log_path, "rb") as log:
                log.seek(start)
                seen = log.read().count(b'"Node device added"')
            if seen >= nodes:
                return
            time.sleep(1.0)
        if nodes:
            raise HamiNotBuilt(f"HAMi's scheduler registered {seen} of {nodes} nodes in {timeout_s:.0f} s; "
                               f"see {log_path}")

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.cluster.logs / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)

    def stop(self) -> None:
        for name, process in reversed(list(self.processes.items())):
            stop_process(process.pid, name)
            process.wait(timeout=5)
        self.processes.clear()


# ---- HAMi's node side, played by the harness ---------------------------------------------------


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def awaits_allocate(pod: dict[str, Any]) -> bool:
    """HAMi bound the pod and its node side has not finished it: bound (spec.nodeName) and
    bind-phase `allocating` (what HAMi's Bind writes before it binds)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and _annotations(pod).get(BIND_PHASE) == "allocating"


def erased_devices_patch(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod patch of HAMi's plugin after it handed every container its devices: each
    container's entry of the to-allocate annotation emptied (one separator per container left)."""
    entries = _annotations(pod).get(DEVICES_TO_ALLOCATE, "").count(CONTAINER_SEPARATOR)
    return {"metadata": {"annotations": {DEVICES_TO_ALLOCATE: CONTAINER_SEPARATOR * entries}}}


def success_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {BIND_PHASE: "success"}}}


def lock_held_by(lock: str, namespace: str, name: str) -> bool:
    """HAMi's owner check: a lock `<time>,<namespace>,<pod>` is this pod's; a legacy lock (a bare
    time, no owner) is anyone's."""
    return LOCK_SEPARATOR not in lock or lock.endswith(f"{LOCK_SEPARATOR}{namespace}{LOCK_SEPARATOR}{name}")


def lock_release_patch(node: dict[str, Any], namespace: str, name: str) -> dict[str, Any] | None:
    """The node patch that deletes the pod's lock, conditional on the node's resourceVersion as
    HAMi's is; None when the node has no lock or another pod holds it."""
    lock = _annotations(node).get(NODE_LOCK)
    if lock is None or not lock_held_by(lock, namespace, name):
        return None
    return {"metadata": {"annotations": {NODE_LOCK: None}, "resourceVersion": node["metadata"]["resourceVersion"]}}


class NodeSide:
    """The bench harness standing in for HAMi's device plugin on the simulated nodes: `see` (fed
    by the burst's pod watch) starts, once per pod, the writes HAMi's plugin makes after a
    successful Allocate; `close` waits for those in flight. A write that fails is counted in
    `errors` (the figures say how many), never dropped silently."""

    def __init__(self, kube: Kube, *, concurrency: int = 32) -> None:
        self.kube = kube
        self.gate = asyncio.Semaphore(concurrency)
        self.started: set[tuple[str, str]] = set()
        self.tasks: set[asyncio.Task] = set()
        self.released = 0
        self.errors: list[str] = []

    def see(self, pod: dict[str, Any]) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if key in self.started or not awaits_allocate(pod):
            return
        self.started.add(key)
        task = asyncio.get_running_loop().create_task(self._finish(pod))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _finish(self, pod: dict[str, Any]) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        path = object_path("v1", "pods", name, namespace=namespace)
        async with self.gate:
            try:  # HAMi's order: erase the devices, read the pod back, phase success, release the lock
                await self.kube.merge_patch(path, erased_devices_patch(pod))
                await self.kube.get(path)
                await self.kube.merge_patch(path, success_patch())
                await self._release(pod["spec"]["nodeName"], namespace, name)
            except ApiError as error:
                self.errors.append(f"{namespace}/{name}: {error}")

    async def _release(self, node_name: str, namespace: str, name: str) -> None:
        path = object_path("v1", "nodes", node_name)
        for _ in range(RELEASE_ATTEMPTS):
            patch = lock_release_patch(await self.kube.get(path), namespace, name)
            if patch is None:
                return
            try:
                await self.kube.merge_patch(path, patch)
            except Conflict:
                continue  # the node changed under us (an agent's status): read it again
            self.released += 1
            return
        self.errors.append(f"{namespace}/{name}: node {node_name}'s lock still conflicting after "
                           f"{RELEASE_ATTEMPTS} attempts")

    async def close(self) -> None:
        await asyncio.gather(*list(self.tasks))
