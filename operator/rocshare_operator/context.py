"""What every handler of this operator shares: the API connection, operator
settings, the cluster feed (Nodes and Pods, watched once for the whole process) with
the slices index the reconcilers read, and the wake-up registry that links events to
reconcile loops.

Handlers find it as ``memo.rocshare`` (Kopf copies the operator's memo shallowly
into each object's memo, so they all see this one object).

Each pool and share has one reconcile loop (pool_loops.py; a Kopf daemon for shares) that
sleeps until it is woken or a resync interval passes. Events on other objects (nodes, AmdGpuNodes,
pods, DaemonSets, quotas, other pools) only wake the loops they concern, so a
burst of events costs one reconcile per loop, and loops never spin.

Nothing here is state that matters after a restart: every loop reconciles once on
start, and the `applied` fingerprints only save redundant writes.

A wake whose only reason is USAGE (a slice bound or released) is paced: status that reports
usage is for people and dashboards, and a burst binding fifty pods a second would otherwise
rewrite the pool's status five times a second (a write, a watch event to every reader, a pass
over every member node each time). Any other wake is taken at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rocshare.kube.client import Kube
from rocshare_operator.holds import Accounts
from rocshare_operator.feed.cluster_feed import ClusterFeed
from rocshare_operator.leadership import DecisionGate
from rocshare_operator.status.pool_logic import NodeView
from rocshare_operator.status.pool_status import Inventory
from rocshare_operator.status.usage import SliceIndex

AGENT_NAME = "rocshare-node-agent"
DEFAULT_AGENT_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
LoopKey = tuple[Hashable, ...]  # ("pool", name) or ("share", namespace, name)
USAGE = "usage"
"""The wake reason of a slice bound, changed or released: the loop's status reports it."""
USAGE_PASS_S = 5.0
"""At most one pass per this many seconds for wakes that are USAGE alone."""


def pool_key(name: str) -> LoopKey:
    return ("pool", name)


def share_key(namespace: str, name: str) -> LoopKey:
    return ("share", namespace, name)


@dataclass
class LoopState:
    """One reconcile loop's wake-up flag, why it was woken, and what it last wrote."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    urgent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by a wake for anything but USAGE alone: the pass must not wait for the usage pace."""
    reasons: set[str] = field(default_factory=set)
    applied: dict[str, Any] = field(default_factory=dict)
    view: Any = None  # what the loop last reconciled (a pool's PoolView): lets events tell whom they concern
    passed_at: float = float("-inf")
    """time.monotonic() when the last pass took its reasons."""

    def take_reasons(self) -> set[str]:
        """Clear the flags and return the reasons, before a reconcile, so later wakes cause another pass."""
        self.event.clear()
        self.urgent.clear()
        self.passed_at = time.monotonic()
        reasons, self.reasons = self.reasons, set()
        return reasons

    def usage_wait_s(self) -> float:
        """How long a pass woken by USAGE alone still waits (0: go now)."""
        if self.urgent.is_set() or self.reasons != {USAGE}:
            return 0.0
        return max(0.0, self.passed_at + USAGE_PASS_S - time.monotonic())


class Wakeups:
    """Registry of running reconcile loops by key."""

    def __init__(self) -> None:
        self._loops: dict[LoopKey, LoopState] = {}

    def register(self, key: LoopKey) -> LoopState:
        state = self._loops[key] = LoopState()
        return state

    def unregister(self, key: LoopKey, state: LoopState) -> None:
        # A recreated object may already have a new loop under the same key: keep that one.
        if self._loops.get(key) is state:
            del self._loops[key]

    def get(self, key: LoopKey) -> LoopState | None:
        return self._loops.get(key)

    def wake(self, key: LoopKey, reason: str = "") -> None:
        """Wake one loop; a key without a running loop is fine (it reconciles when it starts)."""
        state = self._loops.get(key)
        if state is not None:
            state.reasons.add(reason or "")
            if reason != USAGE:
                state.urgent.set()
            state.event.set()

    def wake_kind(self, kind: str, reason: str = "") -> None:
        for key in list(self._loops):
            if key[0] == kind:
                self.wake(key, reason)

    def wake_where(self, kind: str, concerned: Callable[[LoopKey, LoopState], bool], reason: str = "") -> None:
        for key, state in list(self._loops.items()):
            if key[0] == kind and concerned(key, state):
                self.wake(key, reason)

    def wake_shares_in(self, namespace: str, reason: str = "") -> None:
        self.wake_where("share", lambda key, _state: key[1] == namespace, reason)


@dataclass(frozen=True)
class AgentDeployment:
    """Operator-level settings for every pool's agent DaemonSet (reconcilers/agent_daemonset.py)."""

    namespace: str = "rocshare-system"
    service_account: str = AGENT_NAME
    resources: Mapping = field(default_factory=lambda: DEFAULT_AGENT_RESOURCES)


@dataclass
class OperatorContext:
    kube: Kube
    agent: AgentDeployment
    feed: ClusterFeed
    slices: SliceIndex = field(default_factory=SliceIndex)
    """What pods hold, by node and namespace, as status reads it: derived from `accounts`."""
    accounts: Accounts | None = None
    """The process's one index of what pods hold (holds.py): the extender's when it runs
    in this process, else the reconcilers' own (reconcilers/nodes_status.py wires it)."""
    wakeups: Wakeups = field(default_factory=Wakeups)
    kubeconfig: str | None = None
    gate: DecisionGate = field(default_factory=DecisionGate)
    """Whether this replica's extender decides (leadership.py); drained on SIGTERM."""

    def node_views(self) -> list[NodeView]:
        """Every readable Node's view; one that cannot be read is left as it is (no pool marks or
        unmarks what it cannot see)."""
        return [facts.view for facts in self.feed.node_facts() if facts.problem is None]

    def inventory(self, node: str) -> Inventory | None:
        """The node's AmdGpuNode as status reads it; None when the node has none."""
        facts = self.feed.gpu_node(node)
        return None if facts is None else Inventory.of(facts)
