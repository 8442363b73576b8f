"""The node's container account folders (docs/container-account.md): made at Allocate / prepare,
their slice limits written whole, read back for the metrics, removed when their owner is gone.

Layout under the root (host path, root only): ``pods/<pod uid>/<container>/`` (device plugin)
and ``claims/<claim uid>/`` (DRA: one per claim, shared by its consumers); each holds ``usage/``
(mounted read-write: the hook's file) and ``slice/`` (mounted read-only: the agent's limits).

Reading is done as with untrusted input, because the container writes ``usage/``: every folder
and file is opened relative to its parent's descriptor with O_NOFOLLOW (a symlink the container
plants is refused, never followed), files non-blocking and used only when regular, reads bounded
by the contract's sizes. A folder that cannot be read is reported as such for that scrape.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocshare.api.container_account import (
    LIMITS_FILE,
    LIMITS_MAX_BYTES,
    SLICE_DIR,
    USAGE_DIR,
    USAGE_FILE,
    USAGE_FILE_BYTES,
    AccountFormatError,
    SliceLimits,
    Usage,
    decode_limits,
    decode_usage,
    encode_limits,
)

from rocshare_agent.deviceplugin.container_spec import AccountFolders

log = logging.getLogger(__name__)

PODS = "pods"
CLAIMS = "claims"
REMOVE_GRACE_S = 300.0
MAX_FOLDERS = 4096
"""Accounts read per scrape at most (a node runs a few hundred pods)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class AccountOwner:
    """Whose account: a pod's container (kind "pod") or a claim (kind "claim", container "")."""

    kind: str
    uid: str
    container: str = ""


@dataclass(frozen=True)
class AccountReading:
    owner: AccountOwner
    usage: Usage | None
    limits: SliceLimits | None
    error: str | None = None
    """Why usage or limits could not be read (None: both were)."""


def _component(name: str) -> str:
    """A uid or container name as one path component; ValueError when it could be anything else."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 253:
        raise ValueError(f"{name!r} cannot name an account folder")
    return name


class AccountStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- writing (the agent's own folders) ----

    def pod_folder(self, pod_uid: str, container: str) -> Path:
        return self.root / PODS / _component(pod_uid) / _component(container)

    def claim_folder(self, claim_uid: str) -> Path:
        return self.root / CLAIMS / _component(claim_uid)

    def prepare(self, folder: Path, limits: SliceLimits) -> AccountFolders:
        """Make the folder (usage world-writable for any uid of the container, slice root's) and write
        the limits; the mounts to hand over. Idempotent: a retried Allocate or prepare keeps the usage."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the runtime (root) binds it; nobody else walks in
        usage, slice_dir = folder / USAGE_DIR, folder / SLICE_DIR
        for path, mode in ((folder.parent, 0o711), (folder, 0o711), (usage, 0o777), (slice_dir, 0o755)):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode)
        self.write_limits(folder, limits)
        return AccountFolders(str(usage), str(slice_dir))

    def write_limits(self, folder: Path, limits: SliceLimits) -> None:
        """Whole (temporary file, fsync, rename): the hook reads the old file or the new one."""
        slice_dir = folder / SLICE_DIR
        temporary = slice_dir / f".{LIMITS_FILE}.tmp"
        with open(temporary, "w") as file:
            file.write(encode_limits(limits))
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, slice_dir / LIMITS_FILE)

    def remove_pods_except(self, live_pod_uids: Iterable[str]) -> list[str]:
        """Remove the accounts of pods not in `live_pod_uids`; the uids removed."""
        return self._remove_except(self.root / PODS, set(live_pod_uids))

    def remove_claims_except(self, prepared_claim_uids: Iterable[str]) -> list[str]:
        return self._remove_except(self.root / CLAIMS, set(prepared_claim_uids))

    def remove_claim(self, claim_uid: str) -> None:
        shutil.rmtree(self.claim_folder(claim_uid), ignore_errors=True)

    @staticmethod
    def _remove_except(parent: Path, keep: set[str]) -> list[str]:
        """Entries of `parent` not in `keep`, except those made in the last REMOVE_GRACE_S (Allocate
        may have served a pod the caller's cache does not show yet)."""
        if not parent.is_dir():
            return []
        now = time.time()
        removed = [entry.name for entry in parent.iterdir()
                   if entry.name not in keep and now - entry.lstat().st_mtime >= REMOVE_GRACE_S]
        for name in removed:
            target = parent / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        return removed

    # ---- reading (untrusted) ----

    def read_all(self) -> Iterator[AccountReading]:
        """Every account on the node, at most MAX_FOLDERS."""
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return
        try:
            count = 0
            for owner, folder_fd in _account_folders(root_fd):
                count += 1
                try:
                    yield read_account(owner, folder_fd)
                finally:
                    os.close(folder_fd)
                if count >= MAX_FOLDERS:
                    log.warning("accounts: more than %d folders under %s; the rest are not read",
                                MAX_FOLDERS, self.root)
                    return
        finally:
            os.close(root_fd)


def _subdir(parent_fd: int, name: str) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None


def _listing(fd: int) -> list[str]:
    try:
        return sorted(os.listdir(fd))[:MAX_FOLDERS]
    except OSError:
        return []


def _account_folders(root_fd: int) -> Iterator[tuple[AccountOwner, int]]:
    pods_fd = _subdir(root_fd, PODS)
    if pods_fd is not None:
        try:
            for uid in _listing(pods_fd):
                pod_fd = _subdir(pods_fd, uid)
                if pod_fd is None:
                    continue
                try:
                    for container in _listing(pod_fd):
                        folder_fd = _subdir(pod_fd, container)
                        if folder_fd is not None:
                            yield AccountOwner("pod", uid, container), folder_fd
                finally:
                    os.close(pod_fd)
        finally:
            os.close(pods_fd)
    claims_fd = _subdir(root_fd, CLAIMS)
    if claims_fd is not None:
        try:
            for uid in _listing(claims_fd):
                folder_fd = _subdir(claims_fd, uid)
                if folder_fd is not None:
                    yield AccountOwner("claim", uid), folder_fd
        finally:
            os.close(claims_fd)


def read_bounded(dir_fd: int, name: str, max_bytes: int) -> bytes:
    """A regular file `name` in the folder `dir_fd`, never through a symlink, at most max_bytes;
    OSError or AccountFormatError otherwise."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AccountFormatError(f"{name} is not a regular file")
        if info.st_size > max_bytes:
            raise AccountFormatError(f"{name} is {info.st_size} bytes, more than {max_bytes}")
        return os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)


def _read_in(folder_fd: int, subdir: str, name: str, max_bytes: int) -> bytes:
    fd = os.open(subdir, _DIR_FLAGS, dir_fd=folder_fd)
    try:
        return read_bounded(fd, name, max_bytes)
    finally:
        os.close(fd)


def read_account(owner: AccountOwner, folder_fd: int) -> AccountReading:
    errors: list[str] = []
    usage = limits = None
    try:
        limits = decode_limits(_read_in(folder_fd, SLICE_DIR, LIMITS_FILE, LIMITS_MAX_BYTES))
    except (OSError, AccountFormatError) as error:
        errors.append(f"limits: {error}")
    try:
        usage = decode_usage(_read_in(folder_fd, USAGE_DIR, USAGE_FILE, USAGE_FILE_BYTES))
    except FileNotFoundError:
        pass  # no process of the container has allocated yet: nothing held
    except (OSError, AccountFormatError) as error:
        errors.append(f"usage: {error}")
    return AccountReading(owner, usage, limits, "; ".join(errors) or None)
