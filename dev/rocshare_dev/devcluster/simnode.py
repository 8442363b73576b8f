"""A simulated GPU node: the kubelet peer and a rocshare agent on a real sysfs capture.

`SimulatedNode(...).start()` runs ``kubelet-peer`` (the kubelet's own device manager, in a
private mount namespace with this node's plugin folder on /var/lib/kubelet/device-plugins)
and ``rocshare agent`` pointed at the same folder by its real path, with sysfs from a
capture and a /dev made of plain files for the capture's device nodes. Used by the e2e tests
and `make demo`. Needs root (mount namespaces) and the kubelet-peer binary.

With `dra=True` the node is a DRA node: the agent runs as a DRA driver (--interface=DRA) with its
plugin socket under <root>/plugins, its registration socket in <root>/registry and its CDI specs in
<root>/cdi; the kubelet peer watches <root>/registry with the kubelet's plugin and DRA managers,
prepares each pod's claims over the plugin's socket before it reports the pod Running, and reads
the CDI specs there as the container runtime would (controlplane/cmd/kubelet-peer/dra.go, cdi.go).
Unix socket paths hold at most 107 bytes: give a DRA node a short work_dir.

Health is simulated through /dev: `set_gpu_healthy(minor, False)` removes the render node the
agent checks, as a lost device would. Pool settings are written on the Node the way the
operator does (annotation rocshare.io/pool-settings) before the agent starts, when given.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rocshare.api.node_settings import POOL_SETTINGS_ANNOTATION, NodeSettings, encode_settings
from rocshare_dev.devcluster.controlplane import DEFAULT_BIN_DIR, stop_process
from rocshare_dev.devcluster.hook_stand_in import stand_in_library


PEER_CONTAINERS_CONDITION = "kubelet-peer.rocshare.io/Containers"
"""The pod condition in which the kubelet peer reports what each container would receive
(controlplane/cmd/kubelet-peer/pods.go): written with the status that moves the pod to Running."""


def runtime_specs(pod: dict) -> dict | None:
    """Per container name, what the kubelet peer handed the runtime (envs, devices, mounts,
    deviceIDs from device plugins, cdiDevices from DRA claims, whose CDI edits are in envs, devices
    and mounts as the runtime applies them); None while the peer has not admitted the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == PEER_CONTAINERS_CONDITION:
            return json.loads(condition.get("message") or "{}")
    return None


class SimNodeError(RuntimeError):
    pass


class SimulatedNode:
    def __init__(self, *, name: str, kubeconfig: Path | str, sysfs_root: Path, work_dir: Path,
                 bin_dir: Path = DEFAULT_BIN_DIR, settings: NodeSettings | None = None,
                 health_interval_s: float = 0.5, hook_dir: Path | None = None, labels: dict[str, str] | None = None,
                 agent_args: tuple[str, ...] = (), taints: tuple[str, ...] = (), dra: bool = False) -> None:
        self.name = name
        self.kubeconfig = str(kubeconfig)
        self.sysfs_root = Path(sysfs_root)
        self.root = Path(work_dir) / name
        self.bin_dir = Path(bin_dir)
        self.settings = settings
        self.health_interval_s = health_interval_s
        self.hook_dir = hook_dir or self.root / "vgpu"
        self.labels = labels or {}
        self.agent_args = agent_args
        self.taints = taints
        """`key=value:Effect`, set once the Node exists and before the agent registers its GPUs."""
        self.dra = dra
        self._processes: dict[str, subprocess.Popen] = {}

    @property
    def kubelet_pid(self) -> int | None:
        return self._pid("kubelet-peer")

    @property
    def agent_pid(self) -> int | None:
        return self._pid("agent")

    @property
    def account_dir(self) -> Path:
        """The node's container account folders (the agent's --account-dir), its own per simulated node."""
        return self.root / "accounts"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "device-plugins"

    @property
    def dra_plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def dra_registry_dir(self) -> Path:
        return self.root / "registry"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def dev_root(self) -> Path:
        return self.root / "dev"

    # ---- lifecycle -------------------------------------------------------------------

    def start(self, *, timeout_s: float = 30.0) -> None:
        if not (self.bin_dir / "kubelet-peer").exists():
            raise SimNodeError(f"missing {self.bin_dir}/kubelet-peer: run controlplane/build.sh (make controlplane)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.plugin_dir.mkdir(exist_ok=True)
        self._make_dev_tree()
        self._make_hook()
        self.start_kubelet()
        self._wait_for_node(timeout_s)
        if self.taints:  # before any GPU is allocatable: no pod that lacks the toleration can land here
            self._kubectl("taint", "node", self.name, "--overwrite", *self.taints)
        if self.settings is not None:
            self._kubectl("annotate", "node", self.name, "--overwrite",
                          f"{POOL_SETTINGS_ANNOTATION}={encode_settings(self.settings)}")
        self.start_agent()

    def stop(self) -> None:
        self.stop_agent()
        self.stop_kubelet()

    def start_kubelet(self) -> None:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._spawn("kubelet-peer", [
            str(self.bin_dir / "kubelet-peer"), f"--kubeconfig={self.kubeconfig}", f"--node-name={self.name}",
            f"--plugin-dir={self.plugin_dir}", f"--labels={labels}", *self._kubelet_dra_args()])

    def _kubelet_dra_args(self) -> list[str]:
        if not self.dra:
            return []
        return [f"--dra-registry-dir={self.dra_registry_dir}", f"--dra-state-dir={self.root / 'dra-state'}",
                f"--cdi-dir={self.cdi_dir}"]

    def _agent_dra_args(self) -> list[str]:
        if not self.dra:
            return []
        return ["--interface=DRA", f"--dra-plugins-dir={self.dra_plugins_dir}",
                f"--dra-registry-dir={self.dra_registry_dir}", f"--cdi-dir={self.cdi_dir}"]

    def stop_kubelet(self) -> None:
        self._stop("kubelet-peer")

    def restart_kubelet(self) -> None:
        """A kubelet restart: the new peer removes every socket in the folder on start."""
        self.stop_kubelet()
        self.start_kubelet()

    def start_agent(self) -> None:
        self._spawn("agent", [
            sys.executable, "-m", "rocshare.cli", "agent", f"--node-name={self.name}", f"--kubeconfig={self.kubeconfig}",
            f"--sysfs-root={self.sysfs_root}", f"--dev-root={self.dev_root}", f"--device-plugin-dir={self.plugin_dir}",
            f"--hook-path={self.hook_dir}", "--hook-library=External", f"--account-dir={self.account_dir}",
            f"--health-interval-s={self.health_interval_s}", "--monitor-port=0",
            "--cgroup-root=none", *self._agent_dra_args(), *self.agent_args])

    def stop_agent(self) -> None:
        self._stop("agent")

    def restart_agent(self) -> None:
        self.stop_agent()
        self.start_agent()

    def kill_agent(self) -> None:
        """SIGKILL the agent, as a crash or an OOM kill would (no clean-up of its socket)."""
        process = self._processes.pop("agent", None)
        if process is not None:
            stop_process(process.pid, f"agent {self.name}", sig=signal.SIGKILL)
            process.wait(timeout=5)

    # ---- simulated hardware ------------------------------------------------------------

    def _make_hook(self) -> None:
        """A GPU node with a memory hook the agent's check accepts (hook_stand_in.py), unless the
        test made the folder itself (a node without the hook: an existing, empty folder). The
        agent runs with --hook-library=External, so it never writes the folder; no container
        here loads the library."""
        if self.hook_dir.exists():
            return
        self.hook_dir.mkdir(parents=True)
        shutil.copyfile(stand_in_library(), self.hook_dir / "libamvgpu.so")

    def set_gpu_healthy(self, render_minor: int, healthy: bool) -> None:
        node = self.dev_root / "dri" / f"renderD{render_minor}"
        if healthy:
            node.touch()
        else:
            node.unlink(missing_ok=True)

    def _make_dev_tree(self) -> None:
        from rocshare_agent.discovery import discover

        (self.dev_root / "dri").mkdir(parents=True, exist_ok=True)
        (self.dev_root / "kfd").touch()
        for gpu in discover(self.sysfs_root).gpus:
            if gpu.render_minor is not None:
                (self.dev_root / "dri" / f"renderD{gpu.render_minor}").touch()
            if gpu.card is not None:
                (self.dev_root / "dri" / f"card{gpu.card}").touch()

    # ---- helpers -------------------------------------------------------------------------

    def _spawn(self, what: str, command: list[str]) -> None:
        if what in self._processes:
            raise SimNodeError(f"{what} of {self.name} is already running")
        with open(self.root / f"{what}.log", "ab") as log:  # the child keeps its own descriptor
            self._processes[what] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def _stop(self, what: str) -> None:
        """SIGTERM to the process's session (the peer's namespaced child too), then SIGKILL."""
        process = self._processes.pop(what, None)
        if process is not None:
            stop_process(process.pid, f"{what} {self.name}")
            process.wait(timeout=5)

    def _pid(self, what: str) -> int | None:
        process = self._processes.get(what)
        return process.pid if process is not None else None

    def _kubectl(self, *args: str) -> str:
        result = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise SimNodeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _wait_for_node(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                node = json.loads(self._kubectl("get", "node", self.name, "-o", "json"))
                if node.get("status", {}).get("conditions"):
                    return
            except SimNodeError:
                pass
            time.sleep(0.2)
        raise SimNodeError(f"node {self.name} did not appear within {timeout_s:.0f} s; see {self.root}/kubelet-peer.log")
