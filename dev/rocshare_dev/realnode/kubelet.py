"""The kubelet v1.35 of the real node (built by controlplane/build.sh), configured as
real-node.md found to work on this machine:

* cgroupfs driver, `failCgroupV1: false` (v1.35 refuses cgroup v1 otherwise), `failSwapOn: false`;
* serving on the node IP (the bridge's address, inside the rig's namespace only) :10250 with a
  certificate from the cluster CA: the API server calls the kubelet for logs and exec on the
  node's InternalIP (`--kubelet-preferred-address-types=InternalIP`), so 127.0.0.1 refuses them
  ("dial tcp 10.244.0.1:10250: connection refused", seen here); anonymous auth with AlwaysAllow,
  since the dev API server has no kubelet client certificate;
* image GC thresholds at 100 %, so the locally imported images are never collected;
* `--node-ip` on the rig's bridge (the kubelet refuses a loopback node IP);
* its own client certificate `system:node:<name>` (O=system:nodes), with the `system:node`
  ClusterRole bound to the group (the dev API server authorizes with RBAC only).

Its root dir is under the run folder. The device-plugin socket is not: the kubelet's device
manager always serves `/var/lib/kubelet/device-plugins/kubelet.sock`. The kubelet's plugin
watcher (DRA drivers and CSI register there) reads `<root dir>/plugins_registry`, and drivers
put their registration socket in the standard `/var/lib/kubelet/plugins_registry`: the rig
bind-mounts that folder onto the kubelet's (`bind_plugins_registry`; `down` unmounts everything
under the run folder).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from rocshare_dev.devcluster import certs
from rocshare_dev.devcluster.controlplane import ControlPlane
from rocshare_dev.realnode.netns import NetNamespace, run
from rocshare_dev.realnode.network import BRIDGE_ADDRESS

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
# Where DRA drivers' DaemonSets keep their plugin sockets (the agent in DRA mode: gpu.rocshare.io/).
DRA_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def config(*, folder: Path, containerd_socket: Path, feature_gates: tuple[str, ...] = ()) -> dict:
    """The kubelet's configuration file; `feature_gates` as `Name=true` (the control plane's)."""
    gates = {name: value == "true" for name, _, value in (gate.partition("=") for gate in feature_gates)}
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "address": BRIDGE_ADDRESS,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(folder / "serving.crt"),
        "tlsPrivateKeyFile": str(folder / "serving.key"),
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(folder / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared development machine: evict only when it is really full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "maxPods": 30,
        "serializeImagePulls": False,
        "resolvConf": "",
        **({"featureGates": gates} if gates else {}),
    }


class Kubelet:
    def __init__(self, folder: Path, node_name: str) -> None:
        self.folder = folder
        self.node_name = node_name

    @property
    def root_dir(self) -> Path:
        return self.folder / "root"

    def write_files(self, control_plane: ControlPlane, *, containerd_socket: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        ca = certs.KeyPair(control_plane.pki / "ca.crt", control_plane.pki / "ca.key")
        certs.issue(ca, self.folder, "serving", common_name=self.node_name, server=True,
                    dns_names=(self.node_name, "localhost"), ip_addresses=("127.0.0.1", BRIDGE_ADDRESS))
        (self.folder / "ca.crt").write_bytes(ca.cert.read_bytes())
        user = f"system:node:{self.node_name}"
        kubeconfig = control_plane.user_kubeconfig(user, "system:nodes")
        (self.folder / "kubeconfig").write_bytes(kubeconfig.read_bytes())
        control_plane.kubectl("create", "clusterrolebinding", "rocshare-realnode-system-nodes",
                              "--clusterrole=system:node", "--group=system:nodes", check=False)
        conf = config(folder=self.folder, containerd_socket=containerd_socket,
                      feature_gates=control_plane.feature_gates)
        (self.folder / "config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))

    def bind_plugins_registry(self) -> None:
        """The standard registration folder seen as the kubelet's own (see the module docstring).
        The root dir is first made a shared bind mount of itself: the kubelet binds it onto itself
        (non-recursively) unless it already is one with shared propagation, and that bind would
        hide the registry mount below it (seen here: the kubelet then watched an empty folder)."""
        PLUGINS_REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
        target = self.root_dir / "plugins_registry"
        target.mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", str(self.root_dir), str(self.root_dir))
        run("mount", "--make-rshared", str(self.root_dir))
        run("mount", "--bind", str(PLUGINS_REGISTRY_DIR), str(target))

    def start(self, ns: NetNamespace, *, bin_dir: Path, log: Path) -> int:
        command = [*ns.prefix, str(bin_dir / "kubelet"), f"--config={self.folder / 'config.yaml'}",
                   f"--kubeconfig={self.folder / 'kubeconfig'}", f"--root-dir={self.root_dir}",
                   f"--cert-dir={self.folder / 'pki'}", f"--hostname-override={self.node_name}",
                   f"--node-ip={BRIDGE_ADDRESS}", "--v=1"]
        with open(log, "ab") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True).pid


def unmount_under(folder: Path, *, passes: int = 5) -> list[str]:
    """Unmount everything mounted at or below `folder`, deepest first (the kubelet bind-mounts
    its root dir onto itself; volumes, sandboxes' shm and rootfs mounts sit below). Mounts can
    be stacked on one point (the rig's and a kubelet's bind of the root dir): repeated until
    none is left, at most `passes` times."""
    unmounted: list[str] = []
    for _ in range(passes):
        ours = _mount_points_under(folder)
        if not ours:
            break
        for point in ours:
            run("umount", "--lazy", point, check=False)
        unmounted += ours
    return unmounted


def _mount_points_under(folder: Path) -> list[str]:
    prefix = str(folder.resolve())
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    return sorted({p for p in points if p == prefix or p.startswith(prefix + "/")}, key=len, reverse=True)


def remove_kubepods_cgroups() -> list[Path]:
    """rmdir every cgroup under kubepods (v1 controllers and the unified tree), deepest first."""
    removed = []
    for tree in CGROUP_ROOT.iterdir():
        top = tree / "kubepods"
        if not top.is_dir():
            continue
        folders = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
        for folder in folders:
            try:
                folder.rmdir()
                removed.append(folder)
            except OSError:
                pass
    return removed
