"""What the API server says, read from outside rocshare, for the HA chaos and failover tests:

* `LeaseLog` polls kube-scheduler's Lease all through a run: who holds it at each sample (a
  kube-scheduler names itself `<host>_<uuid>`; each replica's kube-scheduler has the replica's name
  as its host, see replica.py), and how long after a fault a live replica holds it again.
* `bindings` reads kube-scheduler's own `Scheduled` events: which kube-scheduler (its host, from
  the event's reportingInstance `<scheduler name>-<host>`) bound each pod, and when.
* `deciders_against_lease` checks that each of those binds came from the replica that held the
  Lease at that moment (one decider: the leader's kube-scheduler).
* `wait_bind_refused_behind` waits for the positive signal that a bind was held behind a node's
  in-flight pod: kube-scheduler's FailedScheduling event naming the pod in flight. A pod bound
  meanwhile fails at once; no event within the time fails too (an extender that is merely slow
  gives no event, so it cannot pass for one that refused).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rocshare.kube.client import ApiError, Kube, NotFound, object_path

SCHEDULED = "Scheduled"
FAILED_SCHEDULING = "FailedScheduling"


@dataclass(frozen=True)
class LeaseSample:
    at_s: float
    """time.time() of the sample."""
    holder: str | None
    """The holder's host (None: no Lease, or no holder)."""
    renewed: str | None
    acquired: str | None = None
    """spec.acquireTime: when the holder (a kube-scheduler run: a new one after a restart) took it."""
    uid: str | None = None
    """The Lease object's uid: a new one when it was deleted and created again (client-go's leader
    may recreate it by its optimistic update, keeping the old acquireTime)."""


def holder_host(identity: str | None) -> str | None:
    """`<host>_<uuid>` -> host."""
    return identity.rsplit("_", 1)[0] if identity else None


@dataclass
class LeaseLog:
    """Samples of the Lease's holder, every `every_s`, until cancelled."""

    kube: Kube
    namespace: str
    name: str
    every_s: float = 0.2
    samples: list[LeaseSample] = field(default_factory=list)
    errors: int = 0

    async def run(self) -> None:
        path = object_path("coordination.k8s.io/v1", "leases", self.name, namespace=self.namespace)
        while True:
            try:
                lease = await self.kube.get(path)
                spec = lease.get("spec") or {}
                self.samples.append(LeaseSample(time.time(), holder_host(spec.get("holderIdentity")),
                                                spec.get("renewTime"), spec.get("acquireTime"),
                                                lease["metadata"].get("uid")))
            except NotFound:
                self.samples.append(LeaseSample(time.time(), None, None))
            except ApiError:
                self.errors += 1  # the API server restarts: no sample
            await asyncio.sleep(self.every_s)

    def holders_near(self, at_s: float, slack_s: float) -> set[str]:
        return {sample.holder for sample in self.samples
                if sample.holder and at_s - slack_s <= sample.at_s <= at_s + slack_s}

    def acquired_after(self, hosts: Callable[[], Iterable[str]], since_s: float) -> float | None:
        """When a host among `hosts()` took the Lease anew after `since_s` (wall clock): its
        acquireTime when that is later, else the first sample showing the Lease object created
        again (a new uid); None while no sample shows either."""
        live = set(hosts())
        before = [sample.uid for sample in self.samples if sample.at_s < since_s and sample.uid]
        for sample in self.samples:
            if sample.at_s < since_s or sample.holder not in live:
                continue
            if sample.acquired and (acquired := _seconds(sample.acquired)) >= since_s:
                return acquired
            if before and sample.uid and sample.uid != before[-1]:
                return sample.at_s
        return None


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Binding:
    pod: str
    host: str
    at_s: float


async def bindings(kube: Kube, namespaces: Iterable[str], scheduler_name: str) -> list[Binding]:
    """Every `Scheduled` event kube-scheduler posted in `namespaces` (events.k8s.io/v1)."""
    found = []
    prefix = f"{scheduler_name}-"
    for namespace in namespaces:
        items = (await kube.list(object_path("events.k8s.io/v1", "events", namespace=namespace)))["items"]
        for event in items:
            if event.get("reason") != SCHEDULED or not (event.get("reportingInstance") or "").startswith(prefix):
                continue
            when = event.get("eventTime") or event.get("deprecatedFirstTimestamp")
            regarding = event.get("regarding") or {}
            found.append(Binding(f"{namespace}/{regarding.get('name')}", event["reportingInstance"][len(prefix):],
                                 datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()))
    return sorted(found, key=lambda binding: binding.at_s)


def deciders_against_lease(found: list[Binding], lease: LeaseLog, *, slack_s: float = 1.0) -> list[str]:
    """Binds by a kube-scheduler whose host held the Lease at no sample within `slack_s` of the bind
    (the sampling interval and the event's clock leave that much doubt)."""
    problems = []
    for binding in found:
        holders = lease.holders_near(binding.at_s, slack_s)
        if holders and binding.host not in holders:
            problems.append(f"{binding.pod} bound by {binding.host} while the Lease named {sorted(holders)}")
    return problems


async def scheduling_events(kube: Kube, namespace: str, pod: str) -> list[dict[str, Any]]:
    items = (await kube.list(object_path("v1", "events", namespace=namespace),
                             fieldSelector=f"involvedObject.name={pod}"))["items"]
    return items


def refused_behind(events: Iterable[dict[str, Any]], holder: str) -> dict[str, Any] | None:
    """The FailedScheduling event saying the pod's node is still allocating `holder` ("ns/name")."""
    for event in events:
        message = event.get("message") or ""
        if event.get("reason") == FAILED_SCHEDULING and f"still allocating pod {holder}" in message:
            return event
    return None


async def wait_bind_refused_behind(get_pod: Callable[[], Awaitable[dict[str, Any]]],
                                   get_events: Callable[[], Awaitable[list[dict[str, Any]]]], holder: str, *,
                                   timeout_s: float, every_s: float = 0.5) -> dict[str, Any]:
    """Until kube-scheduler reports the pod's bind refused behind `holder`; raises AssertionError if
    the pod is bound first, or if no such event comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        pod = await get_pod()
        if (pod.get("spec") or {}).get("nodeName"):
            raise AssertionError(f"{pod['metadata']['name']} bound while {holder} was still in flight on the node")
        event = refused_behind(await get_events(), holder)
        if event is not None:
            return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no FailedScheduling naming {holder} for {pod['metadata']['name']} within "
                                 f"{timeout_s:.0f} s: its bind was never refused (a slow or absent extender?)")
        await asyncio.sleep(every_s)
