"""A burst of pods created at once, timed until every one is Running (or has failed).

`run_burst` watches the namespace from before the first create, creates every pod with at most
`concurrency` requests in flight, and stamps each pod three times on this machine's monotonic
clock: just before its create request, when the watch first shows it bound (spec.nodeName), and
when it first shows it Running. Throughput is pods over the time from the first create to the
last Running (`pods_per_s`), or to the last bound (`bound_per_s`, the measure every scheduler
shares, also one whose pods cannot run here: `until="bound"` ends the burst there). A pod the kubelet rejects (phase
Failed) counts as done but not Running, with its message kept, so a broken run ends early and
says why instead of waiting for its deadline. `on_pod`, when given, is called with every pod
state the watch delivers (the same watch: bench/hami.py's stand-in for HAMi's node side acts on
it). `delete_all` empties a namespace between bursts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocshare.kube.client import ApiError, Kube, Unavailable, object_path


@dataclass
class BurstResult:
    pods: int
    running: int
    failed: dict[str, str]
    create_s: float
    """From the first create to the last create's answer (or the deadline)."""
    all_running_s: float | None
    elapsed_s: float
    """From the first create to the end of the burst (all Running, or the deadline)."""
    latencies_ms: list[float] = field(default_factory=list)
    bound: int = 0
    all_bound_s: float | None = None
    """From the first create to the last pod bound, when every pod was."""

    @property
    def bound_per_s(self) -> float:
        return self.bound / self.all_bound_s if self.all_bound_s else 0.0

    @property
    def pods_per_s(self) -> float:
        if not self.all_running_s:
            return 0.0
        return self.running / self.all_running_s

    def percentile_ms(self, fraction: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class _Tracker:
    def __init__(self, names: set[str], until: str = "running",
                 on_pod: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.names = names
        self.until = until
        self.on_pod = on_pod
        self.created_at: dict[str, float] = {}
        self.bound_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.done = asyncio.Event()

    def see(self, pod: dict[str, Any], now: float) -> None:
        if self.on_pod is not None:
            self.on_pod(pod)
        name = pod["metadata"]["name"]
        if name not in self.names:
            return
        if name not in self.bound_at and (pod.get("spec") or {}).get("nodeName"):
            self.bound_at[name] = now
        if name in self.running_at or name in self.failed:
            return
        status = pod.get("status") or {}
        if status.get("phase") == "Running":
            self.running_at[name] = now
        elif status.get("phase") == "Failed":
            self.failed[name] = status.get("message") or status.get("reason") or "Failed"
        self.check_done()

    def check_done(self) -> None:
        if self.until == "bound":
            finished = len(self.bound_at) + sum(1 for name in self.failed if name not in self.bound_at)
        else:
            finished = len(self.running_at) + len(self.failed)
        if finished == len(self.names):
            self.done.set()


async def _watch(kube: Kube, namespace: str, version: str, tracker: _Tracker) -> None:
    """Feed the tracker until cancelled. A busy server breaks watches and times out lists; each
    break is caught up from a fresh list, retried until one succeeds."""
    path = object_path("v1", "pods", namespace=namespace)
    while True:
        try:
            async for event in kube.watch(path, resource_version=version):
                if event.type in ("ADDED", "MODIFIED", "BOOKMARK"):
                    version = event.object["metadata"]["resourceVersion"]
                if event.type in ("ADDED", "MODIFIED"):
                    tracker.see(event.object, time.monotonic())
                elif event.type == "ERROR":
                    break
        except (ApiError, TimeoutError):
            pass
        version = await _catch_up(kube, path, tracker)


async def _catch_up(kube: Kube, path: str, tracker: _Tracker) -> str:
    while True:
        try:
            listed = await kube.list(path)
        except (ApiError, TimeoutError):  # Kube.request lets a timeout while reading the body through
            await asyncio.sleep(1.0)
            continue
        now = time.monotonic()
        for pod in listed.get("items", []):
            tracker.see(pod, now)
        return listed["metadata"]["resourceVersion"]


async def run_burst(kube: Kube, pods: Sequence[dict[str, Any]], *, namespace: str, timeout_s: float,
                    concurrency: int = 64, until: str = "running",
                    on_pod: Callable[[dict[str, Any]], None] | None = None) -> BurstResult:
    tracker = _Tracker({pod["metadata"]["name"] for pod in pods}, until, on_pod)
    listed = await kube.list(object_path("v1", "pods", namespace=namespace))
    watcher = asyncio.create_task(_watch(kube, namespace, listed["metadata"]["resourceVersion"], tracker))
    gate = asyncio.Semaphore(concurrency)
    path = object_path("v1", "pods", namespace=namespace)

    async def create(pod: dict[str, Any]) -> None:
        async with gate:
            tracker.created_at[pod["metadata"]["name"]] = time.monotonic()
            try:
                await kube.create(path, pod)
            except Unavailable:
                pass  # no answer in time; it may exist all the same, and the watch will tell
            except ApiError as error:
                tracker.failed[pod["metadata"]["name"]] = f"create: {error}"

    started = time.monotonic()
    try:
        creates = asyncio.gather(*(create(pod) for pod in pods))
        try:  # the deadline covers creating too: a stalled admission path must not hold the run
            await asyncio.wait_for(creates, timeout_s)
        except TimeoutError:
            pass
        create_s = time.monotonic() - started
        tracker.check_done()
        done = asyncio.create_task(tracker.done.wait())
        await asyncio.wait((done, watcher), timeout=max(0.0, timeout_s - create_s),
                           return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        if watcher.done():
            watcher.result()  # a bug in the watcher: raise it rather than report a silent timeout
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    complete = len(tracker.running_at) == len(tracker.names)
    all_bound = len(tracker.bound_at) == len(tracker.names)
    return BurstResult(
        pods=len(pods), running=len(tracker.running_at), failed=tracker.failed, create_s=create_s,
        all_running_s=(max(tracker.running_at.values()) - started) if complete else None,
        elapsed_s=time.monotonic() - started,
        latencies_ms=[(at - tracker.created_at[name]) * 1000 for name, at in tracker.running_at.items()],
        bound=len(tracker.bound_at), all_bound_s=(max(tracker.bound_at.values()) - started) if all_bound else None)


async def delete_all(kube: Kube, namespace: str, *, timeout_s: float = 120.0) -> None:
    """Remove every pod of the namespace at once (grace 0) and wait until none is left."""
    path = object_path("v1", "pods", namespace=namespace)
    deadline = time.monotonic() + timeout_s
    try:  # the server deletes a collection one by one: thousands of pods take a while when it is busy
        await kube.request("DELETE", path, query={"gracePeriodSeconds": "0"}, timeout_s=timeout_s)
    except Unavailable:
        pass  # timed out on our side; the server goes on deleting, and the loop below waits for it
    while time.monotonic() < deadline:
        if not (await kube.list(path, limit=1)).get("items"):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"pods of {namespace} still there after {timeout_s:.0f} s")
