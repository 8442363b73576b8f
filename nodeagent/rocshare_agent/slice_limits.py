"""The container's slice limits after a resize: the agent's side of issue 43 (docs/container-account.md).

When a pod's allocation record changes (a resize wrote a record with a higher ``resizeGeneration``,
rocshare.core.resize), the agent rewrites ``slice/limits`` in each of the pod's slice containers'
account folders -- ``<account dir>/pods/<pod uid>/<container>/slice/limits`` -- whole: a temporary
file in ``slice/``, fsync, rename. The memory hook reads the file on every limited allocation, so
the container's next allocation sees the new limit, without a restart.

Only the record is read (the request annotation is the tenant's word; the record is written by the
operator alone, admission refuses it from anyone else). The folder is made by Allocate; a folder
that is not there (the pod was served by an agent without accounts, or not yet) is left alone, and
the next event tries again. Folders are opened one level at a time without following a link
(``O_NOFOLLOW`` relative to the parent's descriptor): the container can write its ``usage/`` folder,
never redirect where the agent writes.

Format, version 1 (the contract): ``rocshare-limits 1``, ``generation <n>``, then per GPU position
``memory <i> <bytes>`` for a slice (a whole GPU has no line) and ``cu-mask <i> <ranges>`` where the
slice has CU ranges. The hook of account43's first version applies the CU mask from the environment
only; the line is written for the hook that applies it to existing queues.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, ContainerAllocation, decode_record
from rocshare.core.cumask import render_ranges
from rocshare.core.holdings import is_plain_init

log = logging.getLogger(__name__)

HEADER = "rocshare-limits 1"
LIMITS_FILE = "limits"
MIB = 1024 * 1024
EVENT_WAIT_S = 30.0


def render_limits(container: ContainerAllocation, generation: int) -> str:
    """The ``slice/limits`` text for one container of a record."""
    lines = [HEADER, f"generation {generation}"]
    for position, device in enumerate(container.devices):
        if device.whole:
            continue
        lines.append(f"memory {position} {device.memory_mib * MIB}")
        if device.cu_ranges:
            lines.append(f"cu-mask {position} {render_ranges(device.cu_ranges)}")
    return "\n".join(lines) + "\n"


def write_limits(account_root: Path, pod_uid: str, container: str, text: str) -> bool:
    """Replace ``slice/limits`` of that container's account; False when its folder is not there."""
    try:
        folder = _open_folder(account_root, ("pods", pod_uid, container, "slice"))
    except FileNotFoundError:
        return False
    try:
        temporary = f".{LIMITS_FILE}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            os.write(fd, text.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, LIMITS_FILE, src_dir_fd=folder, dst_dir_fd=folder)
        os.fsync(folder)
    finally:
        os.close(folder)
    return True


def _open_folder(root: Path, parts: Iterable[str]) -> int:
    """A descriptor of root/parts..., each level opened without following a link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        if not part or part in (".", "..") or "/" in part:
            os.close(fd)
            raise FileNotFoundError(f"not a folder name: {part!r}")
        try:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


class LimitsFollower:
    """Writes each resized record's limits once per (pod, generation)."""

    def __init__(self, account_root: Path) -> None:
        self.account_root = account_root
        self._written: dict[str, tuple[str, int]] = {}
        """Pod uid -> (record text, generation) whose limits are written."""

    def follow(self, pods: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
        """Write what changed; returns (pod uid, container, generation) per file written."""
        written = []
        live = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            uid, text = meta.get("uid") or "", (meta.get("annotations") or {}).get(ALLOCATION_ANNOTATION)
            live.add(uid)
            if not uid or text is None or self._written.get(uid, ("", 0))[0] == text:
                continue
            written += self._write_record(uid, text)
        for uid in set(self._written) - live:
            del self._written[uid]
        return written

    def _write_record(self, uid: str, text: str) -> list[tuple[str, str, int]]:
        try:
            record = decode_record(text)
        except AllocationError:
            return []  # the operator blocks such a pod; nothing here to widen or narrow
        if record.generation == 0:
            self._written[uid] = (text, 0)  # as bound: Allocate wrote its limits
            return []
        written = []
        complete = True
        for container in record.containers:
            if is_plain_init(container.init, container.sidecar) or all(d.whole for d in container.devices):
                continue
            try:
                done = write_limits(self.account_root, uid, container.name, render_limits(container, record.generation))
            except OSError as error:
                log.error("slice limits of pod %s container %s: cannot write: %s", uid, container.name, error)
                done = False
            if done:
                written.append((uid, container.name, record.generation))
            complete = complete and done
        if complete:
            self._written[uid] = (text, record.generation)
        return written


async def follow_resizes(pods, account_root: Path) -> None:
    """Until cancelled: after every change of the node's pod cache (rocshare_agent.deviceplugin.pods),
    write the limits of every resized record not yet written."""
    follower = LimitsFollower(account_root)
    await pods.synced.wait()
    while True:
        for uid, container, generation in follower.follow(pods.cached()):
            log.info("slice limits of pod %s container %s: generation %d written", uid, container, generation)
        await pods.next_event(EVENT_WAIT_S)
