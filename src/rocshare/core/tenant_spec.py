"""What a GPU container's own spec may not do (pure): the tenant boundary of DESIGN.md section 9
at admission, one rule for the device-plugin path and the DRA path.

A container that receives rocshare's GPUs gets its slice through what the node agent hands over
(rocshare.api.container_env): the memory limits, the CU mask, LD_AUDIT and the hook library, the
visible devices. The kubelet applies the pod's own env and envFrom after the device plugin's, and
the last value wins, so a pod could widen its own slice by writing any of them. Refused here:

* ``env`` naming a handed-over variable, with a value or ``valueFrom`` (the name is what counts);
* ``envFrom`` whose prefix can produce one: admission cannot see a ConfigMap's or a Secret's keys
  (and they change after admission), so the rule is on the prefix alone. No prefix, or a prefix a
  handed-over name starts with (``LD_``, ``HIP_``), is refused; ``APP_`` is fine;
* a ``volumeMount`` (or ``volumeDevice``) on the hook's directory, inside it or above it: it would
  replace or hide the library LD_AUDIT names. subPath chooses the source, not the target, so the
  target path is what is judged, normalised as the kubelet does (relative paths are under /);
* for a container holding a slice (amd.com/gpumem, -percentage, -cores, or a DRA claim): a
  privileged container (it sees every GPU, ignores CU masks and limits);
* for a pod with such a container: a hostPath volume of /, or in /dev, /sys or /proc (the host's
  device nodes and GPU controls, beyond the slice's).

Whole GPUs keep env and mount rules (the limits are indexed by HIP_VISIBLE_DEVICES order, which
a pod could reorder) but may be privileged, as before.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rocshare.api.container_env import (
    HANDED_OVER_PREFIXES,
    HOOK_CONTAINER_DIR,
    PROTECTED_NAMES,
    is_protected,
    prefix_can_reach_protected,
)

PROTECTED_ENV_REASON = "ProtectedEnvVar"
PROTECTED_ENV_FROM_REASON = "ProtectedEnvFrom"
HOOK_PATH_MOUNT_REASON = "HookPathMount"
HOST_DEVICE_VOLUME_REASON = "HostDeviceVolume"
PRIVILEGED_SLICE_REASON = "PrivilegedSlice"
HOST_PATHS_REFUSED = ("/dev", "/sys", "/proc")
"""hostPath volumes refused beside a slice: these, anything in them, and / (which holds them)."""
_PROTECTED = ", ".join((*PROTECTED_NAMES, *(f"{prefix}*" for prefix in HANDED_OVER_PREFIXES)))


@dataclass(frozen=True)
class GpuContainer:
    """A container that receives rocshare's GPUs, as admission sees it."""

    where: str
    """How the user reads it: ``containers[0] (main)``."""
    container: Mapping[str, Any]
    holds_slice: bool


def pod_refusal(pod: Mapping[str, Any], gpu_containers: Iterable[GpuContainer]) -> str | None:
    """Why `pod` may not be admitted with `gpu_containers` (its containers that receive rocshare's
    GPUs), starting with the reason's name; None when nothing in it widens a slice."""
    any_slice = False
    for gpu in gpu_containers:
        any_slice = any_slice or gpu.holds_slice
        why = container_refusal(gpu)
        if why is not None:
            return why
    return host_volume_refusal(pod) if any_slice else None


def container_refusal(gpu: GpuContainer) -> str | None:
    container = gpu.container
    for entry in container.get("env") or ():
        name = str(entry.get("name", ""))
        if is_protected(name):
            return (f"{PROTECTED_ENV_REASON}: {gpu.where}: env {name} is set by rocshare for the GPUs it gives "
                    f"the container, or would undo what it sets, and only rocshare may set it; remove it "
                    f"(protected: {_PROTECTED})")
    for source in container.get("envFrom") or ():
        prefix = str(source.get("prefix") or "")
        if prefix_can_reach_protected(prefix):
            return (f"{PROTECTED_ENV_FROM_REASON}: {gpu.where}: envFrom {_source_name(source)} "
                    f"{f'with prefix {prefix!r}' if prefix else 'without a prefix'} could set a variable rocshare "
                    f"protects for the GPUs ({_PROTECTED}), and admission cannot see what it holds; give it a prefix "
                    "none of those starts with (e.g. APP_), or list the variables you need in env")
    for mount in (*(container.get("volumeMounts") or ()), *(container.get("volumeDevices") or ())):
        target = mount.get("mountPath", mount.get("devicePath", ""))
        if covers_hook(str(target)):
            return (f"{HOOK_PATH_MOUNT_REASON}: {gpu.where}: volume {mount.get('name', '?')} mounted at {target} "
                    f"would cover {HOOK_CONTAINER_DIR}, where rocshare mounts the memory hook; mount it elsewhere")
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    if privileged and gpu.holds_slice:
        return (f"{PRIVILEGED_SLICE_REASON}: {gpu.where}: a privileged container sees every GPU and ignores CU "
                "masks and memory limits; it may only ask for whole GPUs")
    return None


def covers_hook(target: str) -> bool:
    """True when a mount at `target` is the hook's directory, inside it, or above it."""
    path = container_path(target)
    return path == HOOK_CONTAINER_DIR or _inside(path, HOOK_CONTAINER_DIR) or _inside(HOOK_CONTAINER_DIR, path)


def host_volume_refusal(pod: Mapping[str, Any]) -> str | None:
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        host_path = (volume.get("hostPath") or {}).get("path")
        if host_path is None:
            continue
        path = container_path(str(host_path))
        if path == "/" or any(path == root or _inside(path, root) for root in HOST_PATHS_REFUSED):
            return (f"{HOST_DEVICE_VOLUME_REASON}: volume {volume.get('name', '?')} is the host's {host_path}: a pod "
                    "holding a GPU slice may not mount the host's /, /dev, /sys or /proc (they reach every GPU "
                    "beyond the slice); remove the volume, or ask for whole GPUs")
    return None


def container_path(target: str) -> str:
    """`target` as the kubelet resolves it: made absolute (under /) and normalised."""
    return posixpath.normpath("/" + target.lstrip("/"))


def _inside(path: str, directory: str) -> bool:
    return directory == "/" or path.startswith(directory.rstrip("/") + "/")


def _source_name(source: Mapping[str, Any]) -> str:
    for kind in ("configMapRef", "secretRef"):
        if kind in source:
            return f"{kind} {(source.get(kind) or {}).get('name', '?')}"
    return "(a source)"
