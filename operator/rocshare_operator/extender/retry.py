"""Prompt retries for pods waiting for room (DESIGN.md section 2, rule 4).

kube-scheduler re-queues an unschedulable pod on cluster events it knows matter, but not
when a namespace's ResourceQuota is raised, and a pod the extender turned away can sit
up to five minutes before its next try. So the extender remembers the pods it filtered
out, and when room may have appeared — capacity released on a node, a quota of their
namespace changed — it touches each such pod (annotation ``rocshare.io/retry``), which
kube-scheduler treats as an update worth retrying. Touches are debounced and bounded.

Who decides writes: every replica notes the waiting pods (from its own pod watch), but only the
replica whose scheduler leads touches them -- the same decision gate the pool loops follow
(leadership.py); a standby's round writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from rocshare.core.ids import PodKey
from rocshare.kube.client import ApiError, Kube, object_path
from rocshare_operator.leadership import DecisionGate

log = logging.getLogger(__name__)

RETRY_ANNOTATION = "rocshare.io/retry"
DEBOUNCE_S = 0.3
MAX_TOUCHES_PER_ROUND = 200


@dataclass
class Retrier:
    kube: Kube
    gate: DecisionGate = field(default_factory=DecisionGate)
    """Touches only while `gate.leading` (the pool loops' rule): a standby writes nothing."""
    waiting: dict[PodKey, str] = field(default_factory=dict)
    """Pods the extender found no room for -> their namespace."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _namespaces: set[str] = field(default_factory=set)
    _everyone: bool = False
    _round: int = 0

    def note_waiting(self, key: PodKey, namespace: str) -> None:
        self.waiting[key] = namespace

    def forget(self, key: PodKey) -> None:
        self.waiting.pop(key, None)

    def room_freed(self) -> None:
        """Capacity was released somewhere: every waiting pod may fit now."""
        if self.waiting:
            self._everyone = True
            self._wake.set()

    def quota_changed(self, namespace: str) -> None:
        if namespace in self.waiting.values():
            self._namespaces.add(namespace)
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(DEBOUNCE_S)
            self._wake.clear()
            everyone, namespaces = self._everyone, self._namespaces
            self._everyone, self._namespaces = False, set()
            targets = [key for key, namespace in self.waiting.items() if everyone or namespace in namespaces]
            if not self.gate.leading:
                log.debug("standing by: the leader retries %d waiting pod(s)", len(targets))
                continue
            await self._touch(targets[:MAX_TOUCHES_PER_ROUND])

    async def _touch(self, keys: list[PodKey]) -> None:
        self._round += 1
        if keys:
            log.info("room may have appeared: retrying %d waiting pod(s)", len(keys))
        for key in keys:
            namespace, _, name = key.partition("/")
            try:
                await self.kube.merge_patch(object_path("v1", "pods", name, namespace=namespace),
                                            {"metadata": {"annotations": {RETRY_ANNOTATION: str(self._round)}}})
            except ApiError as error:
                log.debug("could not touch waiting pod %s: %s", key, error)
                self.forget(key)
