"""`RealNode`: the whole rig up and down, in order.

up: network namespace -> API bridge -> control plane (with the flags pods on this node need)
-> a plain default kube-scheduler -> bridge, conflist, DNAT -> containerd (`runtime`: 2.x built
here by default, or Debian's 1.6; containerd.py) (+ the local images) -> kubelet -> node Ready
-> the kubelet's sysctls restored.
down: pods' containers killed -> kubelet, containerd, control plane, bridge stopped -> mounts
under the run folder unmounted -> kubepods cgroups removed -> iptables chains and the
namespace deleted -> sysctls restored. `down` works from another process too: everything it
needs is in `<run>/state.json`, written as `up` goes.
"""

from __future__ import annotations

import json
import shutil
import socket
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from rocshare_dev.devcluster.controlplane import (DEFAULT_BIN_DIR, PROJECT_ROOT, SERVICE_CIDR, ControlPlane, Ports,
                                                  _alive, dra_feature_gates, k8s_version, stop_process)
from rocshare_dev.realnode import apibridge, network, sysctls
from rocshare_dev.realnode.containerd import DEFAULT_RUNTIME, RUNTIMES, Containerd
from rocshare_dev.realnode.kubelet import (DEVICE_PLUGIN_DIR, DRA_PLUGINS_DIR, PLUGINS_REGISTRY_DIR, Kubelet,
                                           remove_kubepods_cgroups, unmount_under)
from rocshare_dev.realnode.netns import NetNamespace, RigError

IMAGES_DIR = PROJECT_ROOT / ".cache" / "images"
# workload-bullseye/-bookworm: the probe on older glibc generations (the hook's floor, test_hook_enforces.py).
IMAGE_ARCHIVES = ("pause", "operator", "node-agent", "kube-scheduler", "workload", "workload-bullseye",
                  "workload-bookworm")
# Pods here reach the API server through the DNAT (no kube-proxy); webhooks are called on their
# endpoints, and the API server reaches the kubelet (logs, exec) on the node's InternalIP.
APISERVER_FLAGS = ("--enable-aggregator-routing=true", "--kubelet-preferred-address-types=InternalIP")


@dataclass
class State:
    netns: str
    node_name: str
    ports: dict
    pids: dict[str, int] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    # /var/lib/kubelet or its device-plugins folder, if the kubelet made it: removed on down.
    created_dir: str | None = None
    # /var/lib/kubelet/plugins_registry, if the rig made it (and not /var/lib/kubelet): removed on down.
    created_registry_dir: str | None = None
    # /var/lib/kubelet/plugins, if a DRA agent made it (absent when the rig starts): removed on down.
    created_dra_plugins_dir: str | None = None
    runtime: str = DEFAULT_RUNTIME


class RealNode:
    def __init__(self, root: Path, *, netns: str = "rocshare-realnode", node_name: str = "realnode",
                 bin_dir: Path = DEFAULT_BIN_DIR, runtime: str = DEFAULT_RUNTIME) -> None:
        if runtime not in RUNTIMES:
            raise RigError(f"unknown container runtime {runtime!r}: one of {', '.join(RUNTIMES)}")
        self.root = root
        self.bin_dir = bin_dir
        self.runtime = runtime
        self.ns = NetNamespace(netns)
        self.node_name = node_name
        self.state: State | None = None
        self.control_plane: ControlPlane | None = None
        self.step_seconds: dict[str, float] = {}  # how long each part of `up` took

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "cluster" / "kubeconfig"

    @property
    def containerd(self) -> Containerd:
        """The runtime `up` was asked for, or the one a recorded rig runs (for `down`)."""
        runtime = self.state.runtime if self.state else self.runtime
        return Containerd(self.root / "containerd", runtime=RUNTIMES[runtime])

    @property
    def kubelet(self) -> Kubelet:
        return Kubelet(self.root / "kubelet", self.node_name)

    # ---- up ----------------------------------------------------------------------------------

    def up(self, *, timeout_s: float = 600.0) -> None:
        if self.state_file.exists() or self.ns.exists():
            raise RigError(f"a real node is already recorded in {self.root} or netns {self.ns.name} exists: "
                           "run `make real-node-down` first")
        if _serving(DEVICE_PLUGIN_DIR / "kubelet.sock"):
            raise RigError(f"another kubelet serves {DEVICE_PLUGIN_DIR / 'kubelet.sock'} (a real node already up, "
                           "e.g. `make real-node-up`): one real node at a time on a machine")
        missing = [name for name in IMAGE_ARCHIVES if not (IMAGES_DIR / f"{name}.tar").exists()]
        if missing or not (self.bin_dir / "kubelet").exists():
            raise RigError(f"missing images {missing} or the kubelet: run `make controlplane images` first")
        # A fresh folder: etcd data, certificates and kubeconfigs (which name the API server's
        # port) and logs from an earlier run must not leak into this one.
        if self.root.exists():
            unmount_under(self.root)
            shutil.rmtree(self.root)
        self.logs.mkdir(parents=True, exist_ok=True)
        ports = Ports.free()
        created_dir = _first_missing(DEVICE_PLUGIN_DIR)
        self.state = State(netns=self.ns.name, node_name=self.node_name, ports=asdict(ports),
                           sysctls=sysctls.record(), created_dir=created_dir, runtime=self.runtime,
                           created_registry_dir=None if created_dir else _first_missing(PLUGINS_REGISTRY_DIR),
                           created_dra_plugins_dir=None if created_dir else _first_missing(DRA_PLUGINS_DIR))
        self.ns.create()
        self._save()
        try:
            self._up(ports, timeout_s)
        except BaseException:
            self.down()
            raise

    def _up(self, ports: Ports, timeout_s: float) -> None:
        started = time.monotonic()
        self.state.pids.update(apibridge.start(self.ns, socket_path=self.root / "api.sock", port=ports.apiserver,
                                               logs=self.logs))
        self._save()
        control_plane = ControlPlane(root=self.root / "cluster", ports=ports, bin_dir=self.bin_dir,
                                     with_scheduler=False, command_prefix=self.ns.prefix,
                                     extra_apiserver_args=APISERVER_FLAGS,
                                     # DRA shares on this node (tests/realnode/test_dra_shared_claim.py)
                                     feature_gates=dra_feature_gates(k8s_version()))
        self.control_plane = control_plane
        try:
            control_plane.start()
        finally:
            self.state.pids.update({f"cp-{name}": pid for name, pid in control_plane.pids.items()})
            self._save()
        self.step_seconds["control plane"] = time.monotonic() - started
        step = time.monotonic()
        containerd = self.containerd
        if containerd.bin_dir:  # built here (cached: a stamp check) before the namespace needs it
            self.step_seconds["containerd build"] = time.monotonic() - step
        control_plane.start_scheduler(config_path=self._write_default_scheduler_config(control_plane))
        self.state.pids["cp-kube-scheduler"] = control_plane.pids["kube-scheduler"]
        cni_conf_dir = self.root / "cni"
        network.set_up(self.ns, cni_conf_dir=cni_conf_dir, service_cidr=SERVICE_CIDR, apiserver_port=ports.apiserver)
        containerd.write_config(cni_conf_dir=cni_conf_dir)
        self.state.pids["containerd"] = containerd.start(self.ns, self.logs / "containerd.log")
        self._save()
        step = time.monotonic()
        containerd.import_images({IMAGES_DIR / f"{name}.tar": _image_and_stamp(name) for name in IMAGE_ARCHIVES})
        self.step_seconds["image import"] = time.monotonic() - step
        kubelet = self.kubelet
        kubelet.write_files(control_plane, containerd_socket=containerd.socket)
        kubelet.bind_plugins_registry()
        self.state.pids["kubelet"] = kubelet.start(self.ns, bin_dir=self.bin_dir, log=self.logs / "kubelet.log")
        self._save()
        step = time.monotonic()
        self._wait_node_ready(timeout_s - (time.monotonic() - started))
        self.step_seconds["kubelet to node Ready"] = time.monotonic() - step
        changed = sysctls.restore(self.state.sysctls)
        parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.step_seconds.items())
        print(f"real node {self.node_name} ({self.state.runtime}) Ready in {time.monotonic() - started:.0f} s ({parts})"
              f" (restored sysctls the kubelet changed: {', '.join(changed) or 'none'})")

    def _write_default_scheduler_config(self, control_plane: ControlPlane) -> Path:
        """A stock kube-scheduler (default profile) for ordinary pods, as a real cluster has;
        rocshare's own scheduler runs in the operator pod."""
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(control_plane.kubeconfig)},
                  "leaderElection": {"leaderElect": False}}
        path = control_plane.root / "default-scheduler.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _wait_node_ready(self, timeout_s: float) -> None:
        # However long the start took, the kubelet gets two minutes of its own (a loaded machine).
        timeout_s = max(timeout_s, 120)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(self.state.pids["kubelet"]):
                raise RigError(f"the kubelet exited; see {self.logs / 'kubelet.log'}")
            reply = self.control_plane.kubectl("get", "node", self.node_name, "-o",
                                               "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
            if reply.stdout.strip() == "True":
                return
            time.sleep(1)
        raise RigError(f"node {self.node_name} not Ready after {timeout_s:.0f} s; see {self.logs / 'kubelet.log'}")

    # ---- down --------------------------------------------------------------------------------

    def down(self) -> None:
        state = self.state or self._load()
        if state is None:
            return
        self.state = state  # `containerd` is the recorded rig's runtime
        pids = dict(state.pids)
        if "kubelet" in pids:
            stop_process(pids.pop("kubelet"), "kubelet")
        self.containerd.remove_all_tasks()
        if "containerd" in pids:
            stop_process(pids.pop("containerd"), "containerd")
        for name in reversed(list(pids)):
            try:
                stop_process(pids[name], name)
            except RuntimeError as error:
                print(f"warning: {error}")
        unmount_under(self.root)
        remove_kubepods_cgroups()
        network.tear_down(self.ns, service_cidr=SERVICE_CIDR, apiserver_port=state.ports["apiserver"])
        network.remove_cni_cache()
        self.ns.delete()
        for made in (state.created_registry_dir, state.created_dra_plugins_dir):
            if made:
                shutil.rmtree(made, ignore_errors=True)
        if state.created_dir:
            shutil.rmtree(state.created_dir, ignore_errors=True)
        else:  # the folder was there before: take out only what our kubelet and agent left in it
            for name in ("kubelet.sock", "kubelet_internal_checkpoint"):
                (DEVICE_PLUGIN_DIR / name).unlink(missing_ok=True)
            for plugin in DEVICE_PLUGIN_DIR.glob("rocshare-*.sock"):
                plugin.unlink(missing_ok=True)
        sysctls.restore(state.sysctls)
        self.state_file.unlink(missing_ok=True)
        (self.root / "cluster" / "state.json").unlink(missing_ok=True)
        self.state = None

    # ---- state -------------------------------------------------------------------------------

    def _save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(asdict(self.state), indent=2))

    def _load(self) -> State | None:
        if not self.state_file.exists():
            return None
        return State(**json.loads(self.state_file.read_text()))

    def attach(self) -> ControlPlane:
        """The control plane of a rig brought up by another process (for kubectl)."""
        state = self._load()
        if state is None:
            raise RigError(f"no real node recorded in {self.root}")
        self.state = state
        self.control_plane = ControlPlane(root=self.root / "cluster", ports=Ports(**state.ports), bin_dir=self.bin_dir)
        return self.control_plane


def _image_and_stamp(archive: str) -> tuple[str, str]:
    """The image name a docker archive of `make images` holds, and its content stamp."""
    with tarfile.open(IMAGES_DIR / f"{archive}.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    return manifest[0]["RepoTags"][0], (IMAGES_DIR / f"{archive}.stamp").read_text().strip()


def _serving(socket_path: Path) -> bool:
    """Whether something answers on the unix socket (the kubelet's device-manager socket is a
    fixed host path, so two real nodes on one machine would take it from each other)."""
    if not socket_path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(socket_path))
            return True
        except OSError:
            return False


def _first_missing(path: Path) -> str | None:
    """The outermost folder of `path` that does not exist yet (None when it all exists)."""
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return str(missing) if missing else None
