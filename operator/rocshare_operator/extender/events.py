"""Events the extender posts on pods (side effects of the server, never of a decision).

`UnaccountableAllocation` (Warning): the pod's hold cannot be read (its allocation record or
the pod object), so its node takes no new pod and its namespace no new quota until it ends
(docs/accounting.md). Posted once per pod and reason, in the background; a failed post is
logged, never retried in a loop (the metric `rocshare_unaccountable_pods` stays as the record).
Every replica keeps the hold index, but only the one whose scheduler leads posts (`gate.leading`,
the pool loops' rule, leadership.py): a standby posts nothing.
"""

from __future__ import annotations

import asyncio

from rocshare.core.ids import PodKey
from rocshare.kube.client import Kube
from rocshare.kube.events import post_event
from rocshare_operator.leadership import DecisionGate

COMPONENT = "rocshare-extender"
POSTED_MAX = 10_000


class PodEvents:
    def __init__(self, kube: Kube, gate: DecisionGate | None = None) -> None:
        self._kube = kube
        self._gate = gate or DecisionGate()
        self._posted: dict[PodKey, str] = {}
        self._tasks: set[asyncio.Task] = set()

    def unaccountable(self, key: PodKey, namespace: str, node: str, why: str) -> None:
        """Called by `Accounts` (synchronously) when a pod's hold becomes unknown; posts only where
        the gate leads."""
        if not self._gate.leading:
            return
        if self._posted.get(key) == why:
            return
        if len(self._posted) >= POSTED_MAX:
            self._posted.clear()
        self._posted[key] = why
        where = f"node {node} takes no new pods" if node else "it holds nothing until it is bound"
        message = (f"rocshare cannot account for what this pod holds ({why}); {where} and namespace "
                   f"{namespace} no new quota until it ends or can be read")
        task = asyncio.get_running_loop().create_task(self._post(key, "UnaccountableAllocation", message[:1024]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, key: PodKey, reason: str, message: str) -> None:
        namespace, _, name = key.partition("/")
        await post_event(self._kube, {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace},
                         reason=reason, message=message, component=COMPONENT)
