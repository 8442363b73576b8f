"""The extender's accounts: what every live pod holds (the ledger, per GPU; the namespaces'
quota figures) and the in-flight gate. Rebuilt from the pod watch, never the source of truth.

* The `Ledger` holds every live pod's allocation record, applied once, released when the pod
  ends or is deleted, with the pod's CPU and memory requests (holdings.host_request); a bound pod
  without a record (no GPU: any scheduler's) holds only those. The scores read host resources as
  the simulator does (a node whose CPU is gone strands its free GPUs). What a pod holds is rocshare.core.holdings' rule; a namespace's used
  figures are the sum of its pods' `Held`, the same figures share status reports.
* A pod the extender cannot fully account for -- its record cannot be read, its object could
  not be read, or reading it failed -- is `unaccountable`: its node is blocked (no new pod
  goes there, DESIGN.md section 2 rule 5) and its namespace, when it has a quota, takes no
  new pod (its use is unknown). Never "free". It stays so until the pod ends or is read.
* The process's one index of what pods hold: every change of a pod's GPU hold (a record
  committed, a hold become unknown, a pod forgotten) is told to `on_hold`; pool and share status
  derive their index from it, so they and the extender cannot disagree (issue 34).
* The `InFlightGate`: per node at most one pod bound but not yet admitted by the node's kubelet
  (DESIGN.md section 2 rule 2). Bind acquires it; the pod watch releases it when the kubelet's
  own first status write after binding shows (`status.startTime` set, or phase Failed with its
  rejection), or the pod goes. No write of ours is on that path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord
from rocshare.api.pod_lifecycle import awaiting_allocation
from rocshare.core.holdings import NO_HOST_REQUEST, Held, HostRequest, Holding, read_hami, read_record, record_holding
from rocshare.core.ids import PodKey
from rocshare.core.ledger import Ledger
from rocshare_operator.feed.cluster_facts import PodFacts

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    pod: PodKey
    since_s: float


class InFlightGate:
    """At most one pod in flight per node; binds wait for the node's pod to be served."""

    def __init__(self) -> None:
        self.held: dict[str, InFlight] = {}
        self._freed: dict[str, asyncio.Event] = {}

    def holder(self, node: str) -> InFlight | None:
        return self.held.get(node)

    def __contains__(self, node: object) -> bool:
        return node in self.held

    async def wait_free(self, node: str, key: PodKey, deadline: float) -> InFlight | None:
        """Until no pod but `key` is in flight on the node; returns the holder if the deadline passed."""
        while (current := self.held.get(node)) is not None and current.pod != key:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return current
            freed = self._freed.setdefault(node, asyncio.Event())
            try:
                await asyncio.wait_for(freed.wait(), remaining)
            except TimeoutError:
                continue
        return None

    def acquire(self, node: str, key: PodKey) -> None:
        """`key` is in flight on the node (bind decided, or the watch shows it bound and unserved)."""
        self.held[node] = InFlight(key, time.monotonic())

    def release(self, node: str, key: PodKey) -> bool:
        """The pod is no longer in flight there (served, ended, or its bind taken back)."""
        current = self.held.get(node)
        if current is None or current.pod != key:
            return False
        del self.held[node]
        freed = self._freed.pop(node, None)
        if freed is not None:
            freed.set()
        return True


class Accounts:
    def __init__(self, cu_counts: Callable[[str], Mapping[str, int]] = lambda _node: {}) -> None:
        self.ledger = Ledger()
        self.gate = InFlightGate()
        self.pod_nodes: dict[PodKey, str] = {}
        self.pod_held: dict[PodKey, tuple[str, Held]] = {}
        self.namespace_held: dict[str, Held] = {}
        self.unaccountable: dict[PodKey, tuple[str, str, str]] = {}
        """Pod -> (namespace, node, why): what it holds is unknown."""
        self.on_release: list[Callable[[], None]] = []
        self.on_hold: list[Callable[[PodKey, str, Holding | None], None]] = []
        """Called with (pod, namespace, what it holds now; None: nothing) when a pod's GPU hold
        changed: pool and share status derive their index from these (reconcilers/nodes_status.py),
        so status and the extender cannot count a pod differently."""
        self.on_unaccountable: list[Callable[[PodKey, str, str, str], None]] = []
        """Called with (pod, namespace, node, why) when a pod's hold becomes unknown (the server posts an Event)."""
        self._cu_counts = cu_counts
        self.hami_seen: dict[PodKey, tuple[object, str]] = {}
        """Pod -> (HAMi placement, node) last accounted, for pods HAMi placed."""

    # ---- the pod watch -------------------------------------------------------------------

    def on_pod(self, kind: str, pod: PodFacts) -> None:
        key = pod.key
        if kind == "DELETED" or pod.finished:
            self.forget(key)
            return
        if pod.problem is not None:
            self.hold_unknown(key, pod.namespace, pod.node, pod.problem)
            return
        if pod.allocation is None and pod.hami is None:
            if key in self.unaccountable and key not in self.ledger:
                self.forget(key)  # read again, and it holds nothing yet
            # Bind writes the record and the node in one Binding, and nothing removes a record from
            # a live pod: an event without one predates the Binding (the watch lags behind bind), or
            # the pod asks no GPU: bound, it holds its CPU and memory.
            if pod.node:
                self._account_host(key, pod)
            return
        if pod.allocation is None:
            self._account_hami(key, pod)
        elif self.ledger.record(key) is None:
            self._account(key, pod)
        node = self.pod_nodes.get(key)
        if node and not awaiting_allocation(phase=pod.phase, started=pod.started, deleting=pod.deleting):
            self.gate.release(node, key)
        elif node and pod.node == node and node not in self.gate:
            # Bound before this process started (or its bind's own mark was lost): still in
            # flight, so no second pod may be bound to the node until the kubelet admits this one.
            self.gate.acquire(node, key)

    def _account(self, key: PodKey, pod: PodFacts) -> None:
        record, holding = read_record(pod.allocation or "", pod.node)
        if record is None:
            self.hold_unknown(key, pod.namespace, holding.node, holding.problem or "")
            return
        self.unaccountable.pop(key, None)
        self.commit(key, pod.namespace, record, pod.host)

    def _account_host(self, key: PodKey, pod: PodFacts) -> None:
        """A bound pod without a GPU record: its CPU and memory on its node (requests do not
        change once bound, so it is counted once)."""
        if key not in self.ledger and pod.host != NO_HOST_REQUEST:
            self.commit_host(key, pod.node, pod.host)

    def _account_hami(self, key: PodKey, pod: PodFacts) -> None:
        """A pod HAMi placed holds what HAMi says (holdings.read_hami). Unlike rocshare's record,
        HAMi's may be rewritten (its scheduler filters again after a failed bind): read it anew
        whenever it or the pod's node changes."""
        seen = (pod.hami, pod.node)
        if self.hami_seen.get(key) == seen:
            return
        self.hami_seen[key] = seen
        record, holding = read_hami(pod.hami, pod.node)
        if record is not None and (unlisted := self._unlisted_gpus(record)):
            record, holding = None, Holding(record.node, problem=f"its HAMi allocation names GPU(s) "
                                            f"{', '.join(unlisted)} that node {record.node} does not list")
        if key in self.ledger:
            self._uncount(key)
            self.ledger.release(key)
        if record is None:
            self.hold_unknown(key, pod.namespace, holding.node, holding.problem or "")
            return
        self.unaccountable.pop(key, None)
        self.commit(key, pod.namespace, record, pod.host)

    def _unlisted_gpus(self, record: AllocationRecord) -> list[str]:
        """GPU ids of the record that its node's inventory lacks (none known yet: cannot tell)."""
        listed = self._cu_counts(record.node)
        return [gpu for gpu in record.gpu_ids() if listed and gpu not in listed]

    def hold_unknown(self, key: PodKey, namespace: str, node: str, why: str) -> None:
        """What the pod holds cannot be known: its node and its namespace's quota stay blocked."""
        if self.ledger.record(key) is not None:
            self.unaccountable.pop(key, None)
            return  # accounted from its record (read earlier, or bind's own decision): that still holds
        changed = self.unaccountable.get(key) != (namespace, node, why)
        self.unaccountable[key] = (namespace, node, why)
        if changed:
            self._held(key, namespace, Holding(node, problem=why) if node else None)
            log.error("pod %s: %s; node %s takes no new pods and namespace %s no new quota until it ends",
                      key, why, node or "(unknown)", namespace)
            for callback in self.on_unaccountable:
                callback(key, namespace, node, why)
        if node:
            self.pod_nodes[key] = node

    def forget(self, key: PodKey) -> None:
        unknown = self.unaccountable.pop(key, None)
        was_blocking = unknown is not None
        self.hami_seen.pop(key, None)
        node = self.pod_nodes.pop(key, None)
        namespace = self._uncount(key) or (unknown[0] if unknown else None)
        released = key in self.ledger  # a slice, or CPU and memory
        self.ledger.release(key)
        if namespace is not None:
            self._held(key, namespace, None)
        if node:
            self.gate.release(node, key)
        if released or was_blocking:  # room appeared: a slice freed, or a blocked node unblocked
            for callback in self.on_release:
                callback()

    # ---- DRA claims ------------------------------------------------------------------------

    def on_claim(self, key: PodKey, namespace: str, node: str, held: AllocationRecord | str | None) -> None:
        """A ResourceClaim of rocshare's driver, keyed apart from pods (`claim_key`): `held` is its
        record (rocshare.core.dra_shares.claim_record), why it cannot be read, or None when it holds
        nothing (unallocated, deleted). It holds, and counts against its namespace, as a pod would."""
        if held is None:
            if key in self.ledger or key in self.unaccountable:
                self.forget(key)
            return
        if isinstance(held, str):
            self.hold_unknown(key, namespace, node, held)
            return
        if self.ledger.record(key) == held:
            return
        if key in self.ledger:  # allocated, then prepared: the agent's record names the CUs
            self._uncount(key)
            self.ledger.release(key)
        self.unaccountable.pop(key, None)
        self.commit(key, namespace, held)

    # ---- bind ------------------------------------------------------------------------------

    def commit(self, key: PodKey, namespace: str, record: AllocationRecord, host: HostRequest = NO_HOST_REQUEST) -> None:
        """Account a decision the moment bind writes it, before the watch echoes it back."""
        if self.ledger.record(key) is not None:
            return
        self.ledger.apply(record, key, cpu_milli=host.cpu_milli, memory_mib=host.memory_mib)
        self.pod_nodes[key] = record.node
        holding = record_holding(record)
        held = holding.held(self._cu_counts(record.node))
        self.pod_held[key] = (namespace, held)
        self.namespace_held[namespace] = self.namespace_held.get(namespace, Held()) + held
        self._held(key, namespace, holding)

    def _held(self, key: PodKey, namespace: str, holding: Holding | None) -> None:
        for callback in self.on_hold:
            callback(key, namespace, holding)

    def commit_host(self, key: PodKey, node: str, host: HostRequest) -> None:
        """Account a GPU-less pod's CPU and memory on its node (bind's decision, or the watch's)."""
        if key not in self.ledger:
            self.ledger.add_host(node, key, cpu_milli=host.cpu_milli, memory_mib=host.memory_mib)

    def uncommit(self, key: PodKey) -> None:
        """Bind's decision was not written: take it back."""
        self.forget(key)

    def _uncount(self, key: PodKey) -> str | None:
        """Take the pod out of its namespace's figures; its namespace, or None when it held no GPU."""
        namespace, held = self.pod_held.pop(key, ("", None))
        if held is None:
            return None
        self.namespace_held[namespace] = self.namespace_held[namespace] - held
        return namespace

    # ---- views -----------------------------------------------------------------------------

    def blocked_nodes(self) -> set[str]:
        return {node for _namespace, node, _why in self.unaccountable.values()} - {""}

    def used(self, namespace: str) -> Held:
        return self.namespace_held.get(namespace, Held())

    def unaccountable_in(self, namespace: str) -> list[str]:
        """The namespace's bound pods whose hold is unknown (an unbound pod holds nothing)."""
        return [f"{key} ({why})" for key, (ns, node, why) in self.unaccountable.items() if ns == namespace and node]
