"""Hundreds of simulated GPU nodes on one machine, for benchmarks.

`SimulatedFleet` runs one ``kubelet-peer --node-count N`` process (N nodes, each with the
kubelet's own device manager on its own folder, see controlplane/cmd/kubelet-peer/multi.go)
and, unless it is a baseline fleet, one ``python -m rocshare_dev.devcluster.multiagent`` process playing
the N rocshare agents with the agent's own code. A DRA fleet (`dra=True`) runs the peer with each
node's DRA manager (``--dra``) and the agents as DRA drivers: each node publishes its
ResourceSlice and prepares claims over its own sockets, so DRA pods reach Running. A baseline
fleet runs the peer's plain amd.com/gpu plugin instead of rocshare's agents: what a cluster
without rocshare would run.
`SimulatedNode` (one peer and one agent per node, in mount namespaces) stays the faithful
unit for tests; at 500 nodes its 1,000 processes would not fit a 2-core machine.

Nodes are named <prefix>0000 ... and labelled with `labels`. All nodes read one sysfs capture
and one /dev tree of plain files (the capture's device nodes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocshare_dev.devcluster.controlplane import DEFAULT_BIN_DIR, stop_process
from rocshare.api import dra
from rocshare.api.models import AmdGpuNodeStatus
from rocshare.core.quantity import whole_quantity
from rocshare.kube.client import Kube, object_path



class FleetError(RuntimeError):
    pass


def make_dev_tree(sysfs_root: Path, dev_root: Path) -> Path:
    """/dev as plain files for the capture's device nodes (the agent's health check opens them)."""
    from rocshare_agent.discovery import discover

    (dev_root / "dri").mkdir(parents=True, exist_ok=True)
    (dev_root / "kfd").touch()
    for gpu in discover(sysfs_root).gpus:
        if gpu.render_minor is not None:
            (dev_root / "dri" / f"renderD{gpu.render_minor}").touch()
        if gpu.card is not None:
            (dev_root / "dri" / f"card{gpu.card}").touch()
    return dev_root


@dataclass
class SimulatedFleet:
    kubeconfig: Path
    work_dir: Path
    node_count: int
    sysfs_root: Path | None = None
    """The capture every rocshare agent reads (unused by a baseline fleet)."""
    baseline_gpus: int = 0
    """> 0: a baseline fleet (the peer's plain plugin with this many GPUs per node, no agents)."""
    prefix: str = "sim-"
    dra: bool = False
    """The agents are DRA drivers and the peer runs the kubelet's DRA manager per node."""
    labels: dict[str, str] = field(default_factory=dict)
    bin_dir: Path = DEFAULT_BIN_DIR
    heartbeat_s: float = 60.0
    _processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    _plugin_root: Path | None = None

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}{index:04d}" for index in range(self.node_count)]

    @property
    def plugin_root(self) -> Path:
        """Node N's sockets are in <plugin_root>/<N>/. A short folder of its own under the temp
        root: a unix socket path has at most 107 bytes, and work folders can be deep."""
        if self._plugin_root is None:
            self._plugin_root = Path(tempfile.mkdtemp(prefix="rocshare-dp-"))
        return self._plugin_root

    @property
    def pids(self) -> dict[str, int]:
        return {what: process.pid for what, process in self._processes.items()}

    async def start(self, kube: Kube, *, timeout_s: float = 180.0) -> None:
        """Start the peer, wait for every Node, start the agents, wait for every node's GPUs."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.dra:
            check_inotify_instances(self.node_count)
        deadline = time.monotonic() + timeout_s
        self._spawn("kubelet-peer", self._peer_command())
        await self._wait_nodes(kube, deadline, lambda node: bool(node.get("status", {}).get("conditions")), "Ready")
        if not self.baseline_gpus:
            self._spawn("agents", self._agents_command())
        if self.dra:
            await self._wait_slices(kube, deadline)
            return
        await self._wait_nodes(kube, deadline, _has_gpus, "allocatable amd.com/gpu")

    def stop(self) -> None:
        for what in ("agents", "kubelet-peer"):
            process = self._processes.pop(what, None)
            if process is not None:
                stop_process(process.pid, what)
                process.wait(timeout=5)
        if self._plugin_root is not None:
            shutil.rmtree(self._plugin_root, ignore_errors=True)
            self._plugin_root = None

    def _peer_command(self) -> list[str]:
        labels = ",".join(f"{key}={value}" for key, value in self.labels.items())
        return [str(self.bin_dir / "kubelet-peer"), f"--kubeconfig={self.kubeconfig}",
                f"--node-count={self.node_count}", f"--node-name-prefix={self.prefix}",
                f"--plugin-root={self.plugin_root}", f"--labels={labels}",
                f"--heartbeat-interval={self.heartbeat_s:.0f}s", f"--baseline-plugin-gpus={self.baseline_gpus}",
                *(["--dra"] if self.dra else [])]

    def _agents_command(self) -> list[str]:
        if self.sysfs_root is None:
            raise FleetError("a rocshare fleet needs sysfs_root")
        dev_root = make_dev_tree(self.sysfs_root, self.work_dir / "dev")
        return [sys.executable, "-m", "rocshare_dev.devcluster.multiagent", f"--kubeconfig={self.kubeconfig}",
                f"--node-count={self.node_count}", f"--node-name-prefix={self.prefix}",
                f"--plugin-root={self.plugin_root}", f"--sysfs-root={self.sysfs_root}", f"--dev-root={dev_root}",
                f"--heartbeat-s={max(self.heartbeat_s, 300):.0f}", "--log-level=INFO", *(["--dra"] if self.dra else [])]

    def _spawn(self, what: str, command: list[str]) -> None:
        with open(self.work_dir / f"{what}.log", "ab") as log:  # the child keeps its own descriptor
            self._processes[what] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def _check_alive(self) -> None:
        for what, process in self._processes.items():
            if process.poll() is not None:
                raise FleetError(f"{what} exited ({process.returncode}); see {self.work_dir / (what + '.log')}")

    async def _wait_nodes(self, kube: Kube, deadline: float, ready, what: str) -> None:
        wanted = set(self.names)
        done: set[str] = set()
        while time.monotonic() < deadline:
            self._check_alive()
            nodes = (await kube.list(object_path("v1", "nodes"))).get("items", [])
            done = {node["metadata"]["name"] for node in nodes if node["metadata"]["name"] in wanted and ready(node)}
            if done == wanted:
                return
            await asyncio.sleep(1.0)
        raise FleetError(f"{len(wanted - done)} of {len(wanted)} nodes not {what} in time; see {self.work_dir}")


    async def _wait_slices(self, kube: Kube, deadline: float, settle_s: float = 3.0) -> None:
        """Every node's agent published its ResourceSlice, and they are all still there `settle_s`
        later: the peer's DRA manager deletes a node's slices once when it starts (as the kubelet
        does), so a slice written before that would be gone until the agent writes it again."""
        wanted, published, settled = set(self.names), set(), False
        while time.monotonic() < deadline:
            self._check_alive()
            slices = (await kube.list(f"/apis/{dra.RESOURCE_API_VERSION}/resourceslices",
                                      fieldSelector=f"spec.driver={dra.DRIVER_NAME}")).get("items", [])
            published = {item["spec"].get("nodeName") for item in slices} & wanted
            if published == wanted and settled:
                return
            settled = published == wanted
            await asyncio.sleep(settle_s if settled else 1.0)
        raise FleetError(f"{len(wanted - published)} of {len(wanted)} nodes published no ResourceSlice in time; "
                         f"see {self.work_dir}")


INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def check_inotify_instances(nodes: int, *, limit_file: Path = INOTIFY_LIMIT, proc: Path = Path("/proc")) -> None:
    """A DRA fleet's peer runs the kubelet's plugin watcher once per node, and each holds one inotify
    instance: more nodes than this user's free instances (fs.inotify.max_user_instances, 128 by
    default, less those its processes hold) would leave nodes whose DRA plugin never registers, and
    their pods Pending. Raises FleetError then, saying what to change."""
    try:
        limit = int(limit_file.read_text())
    except (OSError, ValueError):
        return  # not Linux's inotify: nothing to check
    free = limit - inotify_instances_held(proc)
    if nodes > free:
        raise FleetError(f"a DRA fleet of {nodes} nodes needs {nodes} inotify instances (one plugin watcher per "
                         f"node) and {free} of fs.inotify.max_user_instances={limit} are free: use fewer nodes, "
                         f"or raise it (sysctl -w fs.inotify.max_user_instances={max(1024, 2 * nodes)})")


def inotify_instances_held(proc: Path = Path("/proc")) -> int:
    """The inotify instances this user's processes hold now (the limit is per user)."""
    uid, held = os.getuid(), 0
    for fds in proc.glob("[0-9]*/fd"):
        try:
            if fds.parent.stat().st_uid != uid:
                continue
            held += sum(1 for fd in fds.iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:  # the process ended meanwhile
            continue
    return held


def _has_gpus(node: dict) -> bool:
    allocatable = node.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0")
    return whole_quantity(allocatable, name="amd.com/gpu", unit="GPUs") > 0


def offered(gpu_node_status: dict) -> bool:
    """An AmdGpuNode status the extender offers GPUs from: GPUs listed, and the agent's DevicePlugin
    condition, where it publishes one, True (AmdGpuNodeStatus.device_plugin_serving)."""
    if not gpu_node_status.get("gpus"):
        return False
    return AmdGpuNodeStatus.model_validate(gpu_node_status).device_plugin_serving()
