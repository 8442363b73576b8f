"""Device files a non-root container can open, made per pod in Allocate.

A container's device nodes are created by the runtime with the host node's owner and mode
(containerd copies them from the DeviceSpec's host path). The GPU's nodes are root-owned,
group `render`/`video`, mode 0660, and those group ids differ between nodes, so a container
running as a non-root user cannot open them unless its pod spec names the right groups.
rocshare knows the node at Allocate time, so it solves this there: for a container that runs
as a non-root user, the agent makes a copy of each device node (same major and minor) in a
folder of its own per pod, owned by the container's user and group, mode 0660 (0666 when the
pod says only `runAsNonRoot` and the user is the image's), and hands those as the host paths.
Root containers get the host's nodes unchanged. The folder is removed when the pod is gone.

Pure parts: `container_identity` (who the container runs as) and `owner_and_mode`. I/O:
`PodDeviceDir`.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rocshare_agent.deviceplugin.container_spec import ContainerSpec, DeviceNode

log = logging.getLogger(__name__)

DEFAULT_POD_DEVICE_DIR = "/var/lib/rocshare/pod-devices"


@dataclass(frozen=True)
class Identity:
    uid: int | None
    """None: the image's user (the pod said runAsNonRoot without a runAsUser)."""
    gid: int | None


def container_identity(pod: Mapping[str, Any], container_name: str) -> Identity | None:
    """Who the container runs as, when that is not root; None for root (or unknown and not
    declared non-root: the image's default user, root for GPU images)."""
    spec = pod.get("spec") or {}
    pod_context = spec.get("securityContext") or {}
    container = next((c for kind in ("initContainers", "containers") for c in spec.get(kind) or []
                      if c.get("name") == container_name), {})
    context = {**pod_context, **(container.get("securityContext") or {})}
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if uid == 0 or (uid is None and not context.get("runAsNonRoot")):
        return None
    return Identity(uid=uid, gid=gid)


def owner_and_mode(identity: Identity, host_gid: int) -> tuple[int, int, int]:
    """(uid, gid, mode) for the pod's copy of a device node whose host group is `host_gid`."""
    if identity.uid is None:
        return 0, host_gid, 0o666
    return identity.uid, identity.gid if identity.gid is not None else host_gid, 0o660


class PodDeviceDir:
    """Per-pod copies of device nodes under `root` (a host path: the runtime reads it there)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def grant(self, spec: ContainerSpec, *, pod_uid: str, container: str, identity: Identity) -> ContainerSpec:
        """`spec` with each device's host path replaced by a node the identity can open."""
        folder = self.root / pod_uid / container
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # the runtime (root) reads it; nobody lists it
        devices = [self._copy(device, folder, identity) for device in spec.devices]
        return replace(spec, devices=devices)

    def _copy(self, device: DeviceNode, folder: Path, identity: Identity) -> DeviceNode:
        source = os.stat(device.host_path)
        if not stat.S_ISCHR(source.st_mode):
            log.warning("%s is not a character device: handed over as it is", device.host_path)
            return device
        target = folder / Path(device.container_path).name
        uid, gid, mode = owner_and_mode(identity, source.st_gid)
        target.unlink(missing_ok=True)
        os.mknod(target, stat.S_IFCHR | mode, source.st_rdev)
        os.chown(target, uid, gid)
        os.chmod(target, mode)  # mknod's mode is masked by the umask
        return replace(device, host_path=str(target))

    def forget_all_but(self, live_pod_uids: Iterable[str]) -> list[str]:
        """Remove the folders of pods not in `live_pod_uids`; the uids removed."""
        keep = set(live_pod_uids)
        if not self.root.is_dir():
            return []
        removed = [entry.name for entry in self.root.iterdir() if entry.is_dir() and entry.name not in keep]
        for uid in removed:
            shutil.rmtree(self.root / uid, ignore_errors=True)
        return removed
