"""The load check (hook/src/loadcheck.c, `rocshare-loadcheck`) as the container runtime meets it.

A slice container gets the memory hook through LD_AUDIT, which only glibc's loader honours and only
when the image's libraries define what the hook needs; elsewhere the slice would run unlimited,
unseen. The check is an OCI createContainer hook that refuses such a container with one line the
kubelet's event carries. It reaches the runtime through CDI, in both modes:

* device plugin: the agent writes one CDI spec (kind `rocshare.io/loadcheck`, device `slice`) whose
  only edit is the hook, and Allocate names it in `cdi_devices` for each container given the hook;
* DRA: the claim's own CDI spec (dra/cdi.py) carries the same hook edit.

Invariants:
* One rule decides which containers are checked: those whose spec carries the hook (LD_AUDIT naming
  the hook's container path, and the library mounted there). Whole-GPU containers get neither.
* The check runs from the host's view (before pivot_root), so it is named by host paths: the program
  in the agent's load-check folder (never the hook's folder, which is the admin's with an External
  library), and the hook library in hookPath, whose own symbol-version needs it reads.
* Files are written whole (temporary file, fsync, rename); an existing, identical file is left alone.
* A runtime without CDI (containerd 1.6, 1.7 without enable_cdi) ignores the device: the check never
  runs there (docs/memory-hook.md). The device plugin's check leaves a witness,
  `<load-check folder>/.loadcheck-ran/<pod uid>_<container>`, before the container starts; a slice container
  seen started without one proves the runtime ignored the device, and the pool's hookMissing decides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from rocshare_agent.deviceplugin.container_spec import HOOK_CONTAINER_PATH, ContainerSpec

SHIPPED_LOAD_CHECK = Path("/opt/rocshare/hook/rocshare-loadcheck")
"""Where the agent image holds the check (images/agent.Dockerfile)."""
DEFAULT_LOAD_CHECK_DIR = "/var/lib/rocshare/loadcheck"
"""The host folder the agent installs the check into (a hostPath of the agent's DaemonSet)."""
LOAD_CHECK_FILE = "rocshare-loadcheck"
CDI_VERSION = "0.6.0"
CDI_KIND = "rocshare.io/loadcheck"
CDI_DEVICE = "slice"
CDI_DEVICE_NAME = f"{CDI_KIND}={CDI_DEVICE}"
SPEC_FILE = "rocshare.io-loadcheck.json"
HOOK_STAGE = "createContainer"  # after the container's mounts, before pivot_root (runc, crun)
WITNESS_DIR = ".loadcheck-ran"


# ---- pure ---------------------------------------------------------------------------------


def hook_library_host_path(spec: ContainerSpec) -> str | None:
    """The host path of the hook a container is given, or None when it is given none."""
    if spec.envs.get("LD_AUDIT") != HOOK_CONTAINER_PATH:
        return None
    return next((m.host_path for m in spec.mounts if m.container_path == HOOK_CONTAINER_PATH), None)


def gets_load_check(spec: ContainerSpec) -> bool:
    """The one rule: a container given the memory hook is checked; any other is not."""
    return hook_library_host_path(spec) is not None


def load_check_hook(library_host_path: str, check_dir: str, *, witness: bool = False) -> dict:
    """The CDI hook edit that runs the check in `check_dir` against `library_host_path` (leaving a
    witness in `check_dir`/WITNESS_DIR when `witness`)."""
    folder = PurePosixPath(check_dir)
    args = [LOAD_CHECK_FILE, "--library", library_host_path, "--audit-path", HOOK_CONTAINER_PATH]
    if witness:
        args += ["--witness-dir", str(folder / WITNESS_DIR)]
    return {"hookName": HOOK_STAGE, "path": str(folder / LOAD_CHECK_FILE), "args": args}


def container_hooks(spec: ContainerSpec, check_dir: str) -> list[dict]:
    """The CDI hooks a container's spec brings: the check when it is given the hook, else none."""
    library = hook_library_host_path(spec)
    return [] if library is None else [load_check_hook(library, check_dir)]


def device_plugin_cdi_spec(check_dir: str, hook_host_dir: str, library_file: str) -> dict:
    """The spec a device plugin's Allocate names (CDI_DEVICE_NAME): the check, nothing else."""
    hook = load_check_hook(str(PurePosixPath(hook_host_dir) / library_file), check_dir, witness=True)
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND,
            "devices": [{"name": CDI_DEVICE, "containerEdits": {"hooks": [hook]}}]}


def witness_name(pod_uid: str, container: str) -> str:
    return f"{pod_uid}_{container}"


def started_unchecked(pods: Iterable[Mapping[str, Any]], expected: Mapping[str, Iterable[str]],
                      witnessed: set[str]) -> list[tuple[Mapping[str, Any], str]]:
    """(pod, container) for each container we named the check for that has started (running or
    terminated in its status) without the check's witness: the runtime ignored the CDI device.
    The witness is written before the container's program runs, so a started container lacks it
    only when the check never ran."""
    unchecked = []
    for pod in pods:
        uid = pod["metadata"].get("uid")
        names = set(expected.get(uid, ()))
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            started = "running" in state or "terminated" in state
            if status.get("name") in names and started and witness_name(uid, status["name"]) not in witnessed:
                unchecked.append((pod, status["name"]))
    return unchecked


def unchecked_message(container: str, *, refusing: bool) -> str:
    then = ("further slices on this node are refused (pool agent.hookMissing: Refuse)" if refusing else
            "slices on this node run unchecked (pool agent.hookMissing: RunWithoutLimit)")
    return (f"container {container} started without rocshare-loadcheck: this node's container runtime ignored its "
            f"CDI device {CDI_DEVICE_NAME} (containerd 1.6, or 1.7 without enable_cdi), so a program the memory "
            f"hook cannot load (musl, static, an old glibc, LD_AUDIT replaced) would run its slice unlimited; {then}")


# ---- on disk ------------------------------------------------------------------------------


def install_load_check(source: Path, check_dir: Path) -> bool:
    """Copies the check into `check_dir` (mode 0755); False when the same file is already there."""
    content = source.read_bytes()
    target = check_dir / LOAD_CHECK_FILE
    if target.is_file() and not target.is_symlink() and target.read_bytes() == content:
        return False
    check_dir.mkdir(parents=True, exist_ok=True)
    _write_whole(target, content, mode=0o755)
    return True


def write_device_plugin_spec(cdi_dir: Path, *, check_dir: Path, hook_host_dir: str, library_file: str) -> Path:
    (check_dir / WITNESS_DIR).mkdir(mode=0o755, parents=True, exist_ok=True)
    cdi_dir.mkdir(parents=True, exist_ok=True)
    target = cdi_dir / SPEC_FILE
    text = json.dumps(device_plugin_cdi_spec(str(check_dir), hook_host_dir, library_file), indent=1, sort_keys=True)
    _write_whole(target, text.encode(), mode=0o644)
    return target


def read_witnesses(check_dir: Path) -> set[str]:
    return {entry.name for entry in (check_dir / WITNESS_DIR).iterdir()}


def remove_witnesses(check_dir: Path, names: Iterable[str]) -> None:
    for name in names:
        (check_dir / WITNESS_DIR / name).unlink(missing_ok=True)


def _write_whole(target: Path, content: bytes, *, mode: int) -> None:
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with temporary.open("wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    temporary.chmod(mode)
    temporary.rename(target)
