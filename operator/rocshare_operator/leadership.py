"""Which operator replica decides, and how one stops deciding.

Every replica runs the extender beside its own kube-scheduler; the kube-schedulers elect a leader
through the Lease `rocshare-scheduler` and only the leader calls its extender (over the pod's
loopback). This module lets the operator follow that one election instead of holding a second one:

* **Who leads.** kube-scheduler writes `<hostname>_<uuid>` into the Lease's holderIdentity, and both
  containers of the operator pod share the pod's hostname: the replica leads while the holder starts
  with `<its hostname>_`. The Lease is watched (one Informer), so a change is seen in milliseconds.
* **The decision gate.** Extender verbs pass `DecisionGate.admit` first: a standby or a replica
  shutting down answers 503, which kube-scheduler treats as a failed attempt and retries (the pod
  goes back to its queue; it is never refused). A request that arrives a moment before the Lease
  event (the scheduler acts on its own write first) waits for it up to `takeover_wait_s`.
  When this replica stops leading, requests still running are cancelled: a bind waiting for a
  node's in-flight gate must not land after another replica decides (its binding is one atomic
  write with the record, so a cancelled bind leaves nothing behind).
* **Kopf.** Kopf peering pauses every operator when two live peers have the same priority, and
  the lower one when priorities differ. The leader raises its peering priority to
  `LEADER_PRIORITY` (and drops peers that still claim it: a SIGKILLed leader's entry would
  otherwise keep both paused for its 60 s lifetime); a standby lowers it. So Kopf's reconcilers
  run in the replica whose scheduler leads, and nowhere else -- while every replica's Kopf still
  serves the admission webhook (it fails closed, so both replicas must answer it).
* **Graceful stop.** On SIGTERM the gate drains: no new decisions, running ones get `drain_s`
  to finish, the rest are cancelled; the webhook answers for `LINGER_S` more (endpoints drop a
  terminating pod asynchronously), then Kopf is stopped. kube-scheduler releases its Lease on
  SIGTERM itself (ReleaseOnCancel is set by kube-scheduler), so the standby takes over within
  one retry period.

Without a Lease name (one replica, tests with a scheduler without leader election) the gate is
always open: this replica is the only decider.

Kopf peering is owned here too (it is how Kopf's reconcilers follow the Lease):

* **Identity.** Kopf names a peer after `getpass.getuser()`, which raises KeyError in the image
  (uid 65532 has no passwd entry). We give it one: the pod's name (`POD_NAME`, from the
  downward API in the Deployment; Kopf's own `POD_ID` is honoured too), else
  `rocshare-operator@<host>/<pid>/<start time>` -- never a user-name lookup.
* **The ClusterKopfPeering `rocshare`.** Created at start when missing. The manifests ship only
  its definition, because an object in the same apply as its CRD fails on the first run
  ("no matches for kind ClusterKopfPeering").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.core import GaugeMetricFamily

from rocshare.kube.client import ApiError, Conflict, Kube, NotFound, object_path
from rocshare.kube.informer import Informer

log = logging.getLogger(__name__)
T = TypeVar("T")

PEERING_NAME = "rocshare"
PEERING_API = "kopf.dev/v1"
LEADER_PRIORITY = 100
STANDBY_PRIORITY = 0
TAKEOVER_WAIT_S = 2.0
"""How long a request waits for the Lease event that makes this replica the leader."""
DRAIN_S = 5.0
"""How long running decisions may take to finish on SIGTERM before they are cancelled."""
LINGER_S = 2.0
"""How long the admission webhook still answers after SIGTERM: Service endpoints drop a terminating
pod asynchronously, and the webhook fails closed, so a request routed here meanwhile must not fail."""


class NotDeciding(Exception):
    """This replica does not decide now (standby, or shutting down); kube-scheduler retries."""


def leads(holder_identity: str, scheduler_host: str) -> bool:
    """True when a kube-scheduler on `scheduler_host` holds the Lease (its id is `<host>_<uuid>`)."""
    return bool(scheduler_host) and holder_identity.startswith(f"{scheduler_host}_")


def holder_of(lease: dict[str, Any] | None) -> str:
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""


@dataclass(eq=False)  # hashable by identity: prometheus-client registers it as a collector
class DecisionGate:
    """Whether this replica's extender decides now, and the decisions it has running."""

    leading: bool = True
    draining: bool = False
    takeover_wait_s: float = TAKEOVER_WAIT_S
    running: set[asyncio.Task] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def deciding(self) -> bool:
        return self.leading and not self.draining

    def role(self) -> str:
        return "shutting down" if self.draining else "leading" if self.leading else "standby"

    def set_leading(self, leading: bool) -> None:
        was, self.leading = self.leading, leading
        self._changed.set()
        self._changed = asyncio.Event()
        if was and not leading:
            self.abandon("this replica's scheduler no longer leads")

    async def wait_changed(self) -> None:
        """Until `leading` next changes."""
        await self._changed.wait()

    async def run(self, decide: Callable[[], Awaitable[T]]) -> T:
        """Run one extender verb, or raise NotDeciding (at once, or when it is abandoned)."""
        if not await self._admitted():
            raise NotDeciding(f"this rocshare extender does not decide ({self.role()})")
        task = asyncio.ensure_future(decide())
        self.running.add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # abandoned by us, not the caller's own cancellation
                raise NotDeciding(f"abandoned: this rocshare extender stopped deciding ({self.role()})") from None
            task.cancel()
            raise
        finally:
            self.running.discard(task)

    async def _admitted(self) -> bool:
        if self.draining:
            return False
        if not self.leading:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.takeover_wait_s)
        return self.deciding()

    def abandon(self, why: str) -> None:
        if self.running:
            log.warning("cancelling %d running extender request(s): %s", len(self.running), why)
        for task in list(self.running):
            task.cancel()

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Take no new decisions; let running ones finish for up to `timeout_s`, cancel the rest."""
        self.draining = True
        if self.running:
            await asyncio.wait(list(self.running), timeout=timeout_s)
        self.abandon("shutting down")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """prometheus-client collector: 1 while this replica's extender decides."""
        gauge = GaugeMetricFamily("rocshare_extender_leading",
                                  "1 while this operator replica's extender decides (its kube-scheduler leads)")
        gauge.add_metric([], 1.0 if self.deciding() else 0.0)
        yield gauge


@dataclass
class LeaseFollower:
    """Follows kube-scheduler's Lease: opens or closes the gate and sets Kopf's peering priority."""

    kube: Kube
    gate: DecisionGate
    namespace: str
    lease: str
    scheduler_host: str
    peering: Any = None
    """Kopf's OperatorSettings.peering when Kopf peers (None: standalone, no priority to follow)."""
    identity: str = ""

    async def run(self) -> None:
        self.gate.set_leading(False)
        self._set_priority(leading=False)
        informer = Informer(self.kube, object_path("coordination.k8s.io/v1", "leases", namespace=self.namespace),
                            self._on_lease, name="scheduler-lease", field_selector=f"metadata.name={self.lease}")
        await informer.run()

    async def _on_lease(self, kind: str, lease: dict[str, Any]) -> None:
        leading = kind != "DELETED" and leads(holder_of(lease), self.scheduler_host)
        if leading == self.gate.leading:
            return
        log.info("this replica %s (Lease %s holder %r)", "leads" if leading else "stands by", self.lease,
                 holder_of(lease))
        self.gate.set_leading(leading)
        self._set_priority(leading=leading)
        if self.peering is not None:
            await self._announce(leading)

    def _set_priority(self, *, leading: bool) -> None:
        if self.peering is not None:
            self.peering.priority = LEADER_PRIORITY if leading else STANDBY_PRIORITY

    async def _announce(self, leading: bool) -> None:
        """Write our new priority into the peering object now (Kopf's keepalive would take up to a
        minute); on taking over, remove other peers that still claim the leader's priority."""
        path = object_path(PEERING_API, "clusterkopfpeerings", PEERING_NAME)
        try:
            peers = (await self.kube.get(path)).get("status") or {}
            await self.kube.merge_patch(path, {"status": peering_status(
                peers, self.identity, leading=leading, lifetime_s=int(self.peering.lifetime),
                now=datetime.datetime.now(datetime.UTC))})
        except ApiError as error:  # Kopf's own keepalive writes the priority later
            log.warning("could not announce the peering priority: %s", error)


def peering_status(peers: dict[str, Any], identity: str, *, leading: bool, lifetime_s: int,
                   now: datetime.datetime) -> dict[str, Any]:
    """The merge patch of the peering object's status: our entry (Kopf's format), and, when we
    lead, None for every other peer at the leader's priority (a stale leader)."""
    patch: dict[str, Any] = {identity: {"priority": LEADER_PRIORITY if leading else STANDBY_PRIORITY,
                                        "lifetime": lifetime_s, "lastseen": now.isoformat()}}
    if leading:
        for other, entry in peers.items():
            if other != identity and isinstance(entry, dict) and entry.get("priority", 0) >= LEADER_PRIORITY:
                patch[other] = None
    return patch


def own_identity(environ: Mapping[str, str], *, hostname: str, pid: int, started: datetime.datetime) -> str:
    for variable in ("POD_NAME", "POD_ID"):
        if environ.get(variable):
            return environ[variable]
    return f"rocshare-operator@{hostname}/{pid}/{started:%Y%m%d%H%M%S}"


def this_process_identity() -> str:
    return own_identity(os.environ, hostname=socket.gethostname(), pid=os.getpid(),
                        started=datetime.datetime.now(datetime.UTC))


async def ensure_peering_object(kube: Kube, name: str = PEERING_NAME) -> None:
    path = object_path(PEERING_API, "clusterkopfpeerings", name)
    try:
        await kube.get(path)
        return
    except NotFound:
        pass
    body = {"apiVersion": PEERING_API, "kind": "ClusterKopfPeering",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "rocshare"}}}
    try:
        await kube.create(object_path(PEERING_API, "clusterkopfpeerings"), body)
        log.info("created ClusterKopfPeering %s", name)
    except Conflict:
        pass  # another replica made it


def stop_on_sigterm(gate: DecisionGate, stop: Callable[[], None]) -> None:
    """Replace Kopf's SIGTERM/SIGINT handler (call once Kopf is up): drain the gate, then `stop`."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task] = set()

    def on_signal() -> None:
        if gate.draining:
            return
        log.info("stopping: no new decisions, %d running", len(gate.running))
        task = loop.create_task(_drain_then(gate, stop), name="drain")
        pending.add(task)

    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, on_signal)


async def _drain_then(gate: DecisionGate, stop: Callable[[], None], linger_s: float = LINGER_S) -> None:
    try:
        await asyncio.gather(gate.drain(), asyncio.sleep(linger_s))
    finally:
        stop()
