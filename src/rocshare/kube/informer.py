"""List+watch caches: how rocshare's processes keep cluster state they read again and again.

Not the only way they learn it: kube-scheduler hands the extender each pod and node names in its
requests, a few writers read one object fresh before they write (the binder's pod, the peering
object, the agent's Node and ResourceSlices, its node's pods when the watch lags, the webhook's
Secret), and Kopf watches the kinds whose handlers it runs (below).

The product's one list+watch (STYLE.md 14): every cache in the operator (the cluster feed's
Nodes, Pods, AmdGpuNodes, ResourceQuotas and AmdGpuPools; the scheduler Lease) and in the node
agent (its node's pods) is an `Informer`, and each kind is watched once per process. Why this
and not Kopf's watcher, in DESIGN's terms:
* continuity: `synced` is set after the first full list, so the extender and webhook answer only
  from whole caches; Kopf offers no "listed everything" signal to a cache outside its handlers;
* paging: lists come in pages of PAGE_SIZE (one unpaged list of 20,000 pods is ~60 MB), and a
  relist after 410 Gone reports objects that vanished meanwhile as deletions;
* decode failures: each object is decoded once into small facts (`decode`) and kept in
  `failing` when that fails -- visible to readiness and metrics, never silently dropped; a
  handler that raises gets the event again with a backoff, never loses it;
* backoff: every retry waits by a backoff list and is logged with its attempt number.
The agent has no Kopf at all, so only this one can serve both processes; and a standby operator
replica's Kopf is paused by peering, which closes its watches, while the standby's extender must
stay current. Kopf still watches the kinds nothing else reads, whose handlers it runs
(AmdGpuShares' reconcile loops, the agent DaemonSets): handler machinery, not caches. The pool
loops and the pool's finalizer run from the feed's pool Informer (rocshare_operator's
reconcilers/pool_loops.py).

An `Informer` lists a collection, hands every object to its handler, then watches
from the list's resourceVersion; when the watch ends it resumes, and when the server
says the version is too old (410 Gone) it lists again and reports objects that
vanished meanwhile as deletions. `synced` is set after the first list, so servers
can refuse to answer until their caches are whole (STYLE.md 4). Errors are retried
with a backoff list, each attempt logged with its number.

What is kept is up to the caller: `decode` turns each object into the value stored
under its key and handed to the handler (by default the object without its managed
fields). A small decoded value keeps memory small at scale, and with
``changed_only=True`` an event whose decoded value equals the stored one (a kubelet
heartbeat, a status tick nobody reads) reaches no handler at all. While a handler
runs, `store` still holds the object's previous value, so a handler can compare.

Failures are retried, never dropped, and always visible:
* a handler that raises leaves `store` as it was (the event is not done) and the event in
  `failing`; it is handed to the handler again with a backoff (each attempt logged with its
  number) until it succeeds, or a newer event for the object replaces it. Handlers must be
  idempotent: a retried event may reach parts of a handler that already took it.
* an object that cannot be decoded is kept in `failing` until a later version decodes or it
  is deleted (retrying the same bytes cannot help); callers that must fail closed decode
  totally (cluster_facts.pod_facts never raises).
`failures_total` counts both; `failing` is what readiness and metrics report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rocshare.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

V = TypeVar("V")

Handler = Callable[[str, Any], Awaitable[None] | None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED", decoded object); a deletion gets the last stored value."""

BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
HANDLER_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
PAGE_SIZE = 500


@dataclass
class Failure:
    """An event not yet taken (`kind` None: an object that cannot be decoded)."""

    kind: str | None
    value: Any
    error: str
    attempts: int
    due_s: float


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Managed fields are often most of an object's size and no handler reads them."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class Informer(Generic[V]):
    def __init__(self, kube: Kube, path: str, handler: Handler, *, name: str = "",
                 label_selector: str | None = None, field_selector: str | None = None,
                 decode: Callable[[dict[str, Any]], Any] = slim, changed_only: bool = False,
                 on_failing: Callable[[], None] | None = None) -> None:
        self._kube = kube
        self._path = path
        self._handler = handler
        self._decode = decode
        self._changed_only = changed_only
        self.name = name or path
        self._query = {key: value for key, value in
                       (("labelSelector", label_selector), ("fieldSelector", field_selector)) if value}
        self.store: dict[str, V] = {}
        self.synced = asyncio.Event()
        self.failing: dict[str, Failure] = {}
        self._on_failing = on_failing
        """Called when an object starts or stops failing (status writers show it)."""
        self.failures_total = 0
        self._retry_wake = asyncio.Event()

    async def run(self) -> None:
        """Run until cancelled."""
        retries = asyncio.create_task(self._retry_failed(), name=f"{self.name}-retries")
        try:
            await self._run()
        finally:
            retries.cancel()

    async def _run(self) -> None:
        attempt = 0
        resource_version = ""
        while True:
            try:
                if not resource_version:
                    resource_version = await self._relist()
                resource_version = await self._watch(resource_version)
                attempt = 0
            except _Expired:
                resource_version = ""
            except ApiError as error:
                if error.status == 410:  # the list's version expired before the watch began
                    resource_version = ""
                    continue
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                log.warning("%s: attempt %d failed (%s); retrying in %.1f s", self.name, attempt, error, delay)
                await asyncio.sleep(delay)
                if attempt > 2:
                    resource_version = ""

    async def _relist(self) -> str:
        seen: set[str] = set()
        resource_version = ""
        token = ""
        while True:  # pages keep each reply small: one unpaginated list of 20,000 pods is ~60 MB
            query = {**self._query, "limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            listing = await self._kube.list(self._path, **query)
            for item in listing.get("items", []):
                key = object_key(item)
                seen.add(key)
                value = self._decoded(key, item)
                if value is not None:
                    await self._update(key, value)
            resource_version = listing.get("metadata", {}).get("resourceVersion", resource_version)
            token = listing.get("metadata", {}).get("continue", "")
            if not token:
                break
        for key in set(self.store) - seen:
            await self._delete(key)
        for key in set(self.failing) - seen - set(self.store):
            self.failing.pop(key, None)  # never taken, and gone since
        self.synced.set()
        return resource_version

    async def _watch(self, resource_version: str) -> str:
        async for event in self._kube.watch(self._path, resource_version=resource_version, **self._query):
            if event.type == "ERROR":
                if event.object.get("code") == 410:
                    raise _Expired()
                raise ApiError(event.object.get("code", 0), event.object.get("reason", ""),
                               event.object.get("message", ""))
            resource_version = event.object.get("metadata", {}).get("resourceVersion", resource_version)
            if event.type == "BOOKMARK":
                continue
            key = object_key(event.object)
            value = self._decoded(key, event.object)
            if event.type == "DELETED":
                await self._delete(key, value)
            elif value is not None:
                await self._update(key, value)
        return resource_version

    def _decoded(self, key: str, obj: dict[str, Any]) -> Any:
        """The decoded object, or None when it cannot be decoded: it stays as it was, and is
        reported in `failing` until a later version decodes or it is deleted."""
        try:
            return self._decode(obj)
        except Exception as error:  # one bad object must not stop the cache
            self.failures_total += 1
            self._failed(key, Failure(None, None, f"cannot decode: {error!r}", 1, float("inf")))
            log.exception("%s: cannot decode %s", self.name, key)
            return None

    async def _update(self, key: str, value: V) -> None:
        previous = self.store.get(key)
        if previous is None:
            kind = "ADDED"
        elif not self._changed_only or previous != value:
            kind = "MODIFIED"
        else:
            self._settled(key)
            return
        if await self._emit(kind, key, value):
            self._settled(key)
            self.store[key] = value

    async def _delete(self, key: str, value: V | None = None) -> None:
        """`value`: the object's last state from a watch event; a relist knows only the stored one."""
        last = value if value is not None else self.store.get(key)
        if last is None:
            self._settled(key)
        elif await self._emit("DELETED", key, last):
            self._settled(key)
            self.store.pop(key, None)

    async def _emit(self, kind: str, key: str, value: Any, attempts: int = 0) -> bool:
        """Hand the event to the handler; False (and kept for a retry) when it raised."""
        try:
            result = self._handler(kind, value)
            if asyncio.iscoroutine(result):
                await result
        except Exception as error:  # one bad object must not stop the cache
            attempts += 1
            self.failures_total += 1
            delay = HANDLER_BACKOFF_S[min(attempts, len(HANDLER_BACKOFF_S)) - 1]
            self._failed(key, Failure(kind, value, repr(error), attempts, time.monotonic() + delay))
            self._retry_wake.set()
            log.exception("%s: handler failed on %s %s (attempt %d); retrying in %.1f s",
                          self.name, kind, key, attempts, delay)
            return False
        return True

    def _failed(self, key: str, failure: Failure) -> None:
        new = key not in self.failing
        self.failing[key] = failure
        if new and self._on_failing is not None:
            self._on_failing()

    def _settled(self, key: str) -> None:
        if self.failing.pop(key, None) is not None:
            log.info("%s: %s is handled again", self.name, key)
            if self._on_failing is not None:
                self._on_failing()

    async def _retry_failed(self) -> None:
        """Hand failed events to the handler again when due (a newer event may have replaced them)."""
        while True:
            due = [failure.due_s for failure in self.failing.values() if failure.kind is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            self._retry_wake.clear()
            try:
                await asyncio.wait_for(self._retry_wake.wait(), timeout)
            except TimeoutError:
                pass
            now = time.monotonic()
            for key, failure in list(self.failing.items()):
                if failure.kind is None or failure.due_s > now or self.failing.get(key) is not failure:
                    continue
                if await self._emit(failure.kind, key, failure.value, failure.attempts):
                    if self.failing.get(key) is not failure:
                        continue  # a newer event for the object was handled meanwhile
                    self._settled(key)
                    if failure.kind == "DELETED":
                        self.store.pop(key, None)
                    else:
                        self.store[key] = failure.value


class _Expired(Exception):
    """The watch's resourceVersion is too old: list again."""
