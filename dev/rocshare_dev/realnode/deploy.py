"""rocshare deployed on the real node as a user deploys it (README.md, "Install on a cluster"; docs/install.md):

    kubectl apply --server-side -k <overlay>

where <overlay> is a kustomization in the run folder over `manifests/overlays/dev` that only
swaps the images for the ones built here (a user's own overlay does the same for a private
registry) and, since this cluster has no DNS, resolves `kubernetes.default.svc` in the operator
pod (Kopf's in-cluster login names the API server so). The node side a GPU node would have:
a sysfs tree (a copy of a real capture), /dev nodes for the GPUs (null devices: containerd
hands only device nodes to containers) and the hook folder, all under the run folder, given to
the agent through the pool's `agent` host-path settings.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, k8s_version
from rocshare_dev.realnode.kubelet import DEVICE_PLUGIN_DIR
from rocshare_dev.realnode.network import kubernetes_service_ip

DEV_OVERLAY = PROJECT_ROOT / "manifests" / "overlays" / "dev"
IMAGES = {
    "rocshare/operator": ("localhost/rocshare/operator", "dev"),
    "registry.k8s.io/kube-scheduler": ("localhost/rocshare/kube-scheduler", f"v{k8s_version()}"),  # make images
}
AGENT_IMAGE = "localhost/rocshare/node-agent:dev"
WORKLOAD_IMAGE = "localhost/rocshare/workload:dev"
WORKLOAD_IMAGES_BY_GLIBC = {  # `make images`: the same stub runtime and hook-probe, compiled in each suite
    "2.31": "localhost/rocshare/workload:bullseye",
    "2.36": "localhost/rocshare/workload:bookworm",
    "2.41": WORKLOAD_IMAGE,  # trixie
}
VIDEO_GID, RENDER_GID = 44, 993
"""The node's video and render group ids (Debian's video is 44; render varies between hosts)."""
NODE_CLASS_LABEL = "rocshare.io/node-class"
NODE_CLASS = "mi210-realnode"
POOL = "realnode-mi210"


def write_overlay(folder: Path, *, service_cidr: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEV_OVERLAY, folder)],
        "images": [{"name": name, "newName": new_name, "newTag": tag} for name, (new_name, tag) in IMAGES.items()],
        "patches": [{"target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": "rocshare-operator"},
                     "patch": yaml.safe_dump([{"op": "add", "path": "/spec/template/spec/hostAliases", "value": [
                         {"ip": kubernetes_service_ip(service_cidr),
                          "hostnames": ["kubernetes.default.svc", "kubernetes.default"]}]}])}],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


@dataclass(frozen=True)
class HostPaths:
    sysfs_root: Path
    dev_root: Path
    hook_dir: Path
    group_file: Path

    @property
    def hook_library(self) -> Path:
        return self.hook_dir / "libamvgpu.so"


def prepare_host(folder: Path) -> HostPaths:
    """The GPU node's host paths: the MI210 capture (with its synthetic VRAM, see captures),
    /dev/kfd and a render node per GPU owned root:render 0660 as on a GPU node (so a non-root
    container cannot open them unless rocshare hands it its own), a group file naming the
    video and render ids, and an empty hook folder."""
    folder.mkdir(parents=True, exist_ok=True)
    sysfs_root = mi210_with_synthetic_vram(FIXTURES, folder)
    dev_root = folder / "dev"
    (dev_root / "dri").mkdir(parents=True, exist_ok=True)
    minors = set()
    for properties in (sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*/properties"):
        found = re.search(r"^drm_render_minor (\d+)$", properties.read_text(), re.MULTILINE)
        if found and int(found.group(1)) > 0:
            minors.add(int(found.group(1)))
    for path in [dev_root / "kfd", *(dev_root / "dri" / f"renderD{minor}" for minor in sorted(minors))]:
        if not path.exists():
            os.mknod(path, 0o660 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's numbers
        os.chown(path, 0, RENDER_GID)
        os.chmod(path, 0o660)
    group_file = folder / "etc-group"
    group_file.write_text(f"root:x:0:\nvideo:x:{VIDEO_GID}:\nrender:x:{RENDER_GID}:\n")
    hook_dir = folder / "vgpu"
    shutil.rmtree(hook_dir, ignore_errors=True)
    return HostPaths(sysfs_root=sysfs_root, dev_root=dev_root, hook_dir=hook_dir, group_file=group_file)


def pool_manifest(host: HostPaths) -> dict:
    return {
        "apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuPool", "metadata": {"name": POOL},
        "spec": {
            "nodeSelector": {NODE_CLASS_LABEL: NODE_CLASS},
            "sharing": {"operatingMode": "cu", "splitCount": 8},
            "health": {"kind": "deviceFiles", "intervalSeconds": 10},
            "agent": {"image": AGENT_IMAGE, "sysfsRoot": str(host.sysfs_root), "devRoot": str(host.dev_root),
                      "devicePluginDir": str(DEVICE_PLUGIN_DIR), "hookPath": str(host.hook_dir),
                      "groupFile": str(host.group_file), "podDeviceDir": str(host.dev_root.parent / "pod-devices")},
        },
    }


def slice_pod(name: str, namespace: str, *, memory_mib: int, cores_pct: int, image: str = WORKLOAD_IMAGE) -> dict:
    """The sample slice (samples/30-pod-gpumem-gpucores.yaml) on an image built here."""
    sample = yaml.safe_load((PROJECT_ROOT / "samples" / "30-pod-gpumem-gpucores.yaml").read_text())
    sample["metadata"] = {"name": name, "namespace": namespace}
    container = sample["spec"]["containers"][0]
    container["image"] = image
    container["imagePullPolicy"] = "Never"
    container["resources"]["limits"].update({"amd.com/gpumem": str(memory_mib), "amd.com/gpucores": str(cores_pct)})
    sample["spec"]["terminationGracePeriodSeconds"] = 1
    return sample
