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
(a ``slice`` that is a link is refused): the container can write its ``usage/`` folder, never redirect
where the agent writes.

The file is the one Allocate writes (api.container_account: limits_for, encode_limits; version 1 of
docs/container-account.md), with the file generation of the record's (api.container_account
file_generation: one more than the record's, so larger than the one Allocate wrote).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, ContainerAllocation, decode_record
from rocshare.api.container_account import SLICE_DIR, file_generation, limits_for
from rocshare.core.holdings import is_plain_init
from rocshare_agent.accounts import AccountStore

log = logging.getLogger(__name__)

EVENT_WAIT_S = 30.0


def write_limits(store: AccountStore, pod_uid: str, container: ContainerAllocation, generation: int) -> bool:
    """Replace ``slice/limits`` of that container's account with the record's of resize `generation`
    (api.container_account limits_for, the rule Allocate writes by; AccountStore.write_limits, whole);
    False when Allocate made no such folder. A ``slice`` that is not a real folder (a link) is an
    error, never followed."""
    folder = store.pod_folder(pod_uid, container.name)
    try:
        mode = os.lstat(folder / SLICE_DIR).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise OSError(f"{folder / SLICE_DIR} is not a folder (a link?): not written")
    store.write_limits(folder, limits_for(container.devices, file_generation(generation)))
    return True


class LimitsFollower:
    """Writes each resized record's limits once per (pod, generation)."""

    def __init__(self, account_root: Path) -> None:
        self.store = AccountStore(account_root)
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
                done = write_limits(self.store, uid, container, record.generation)
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
