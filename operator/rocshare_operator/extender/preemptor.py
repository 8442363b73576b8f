"""Preemption's side effects: kube-scheduler's preempt verb, and the evictions the leading
extender makes itself when filter finds a pod fits no node (preemption.py says why both).

Only the leading replica acts: kube-scheduler calls the extender of its own pod only while it
leads, and the server's decision gate answers 503 elsewhere (leadership.py), so filter -- and
with it a preemption -- runs in one process at a time. What an eviction leaves behind is in the
API server (the victims' DisruptionTarget condition and deletion, the preemptor's
status.nominatedNodeName), so a new leader sees the same victims going and the same hold.

An eviction is kube-scheduler's own: a DisruptionTarget condition (reason
PreemptionByScheduler) on the victim, then a delete with the victim's uid as precondition.
Then the preemptor is nominated (status.nominatedNodeName): kube-scheduler tries the nominated
node first on its next cycle, and, seeing victims terminating there, does not preempt again
(DefaultPreemption's PodEligibleToPreemptOthers). Events name, on the preemptor and on each
victim, the GPU and the slice freed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rocshare.core.holdings import placement_request
from rocshare.core.ids import PodKey, pod_key
from rocshare.core.inventory import NodeInventory
from rocshare.core.preemption import Budget, Occupant, Victims, budget_of, pdb_protected
from rocshare.core.request import PodRequest, RequestError
from rocshare.kube.client import ApiError, Kube, NotFound, object_path
from rocshare.kube.events import post_event
from rocshare_operator.extender.decisions import PreemptionChoice, preemption
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.preemption import pod_priority
from rocshare_operator.extender.state import SchedulerState, Snapshot

log = logging.getLogger(__name__)

COMPONENT = "rocshare-extender"
PREEMPTED_REASON = "Preempted"
"""Event on a victim: which pod preempted it, on which node, and the GPU and slice it freed."""
PREEMPTED_SLICES_REASON = "PreemptedSlices"
"""Event on the preemptor: the pods evicted for it, with each one's GPU and slice."""
NOT_HELPFUL_REASON = "PreemptionNotHelpful"
"""Event on the preemptor: no set of lower-priority pods makes the whole request fit any node."""
OVER_QUOTA_REASON = "PreemptionOverQuota"
"""Event on the preemptor: it is over its namespace's quota, so it evicts nobody."""
DISRUPTION_REASON = "PreemptionByScheduler"
"""The victim's DisruptionTarget condition, kube-scheduler's own word."""
# rocshare_preemptions_total{reason}:
EVICTED, PROPOSED, NOT_HELPFUL, OVER_QUOTA, POLICY_NEVER = "evicted", "proposed", "not_helpful", "quota", "policy_never"
SEEN_GOING_S = 5.0
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass
class Preemptor:
    kube: Kube | None
    state: SchedulerState
    metrics: ExtenderMetrics
    _busy: set[PodKey] = field(default_factory=set)
    _told: dict[PodKey, str] = field(default_factory=dict)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    # ---- kube-scheduler's preempt verb ----------------------------------------------------------

    async def process(self, args: dict[str, Any]) -> dict[str, Any]:
        """ExtenderPreemptionArgs -> ExtenderPreemptionResult (the meta form: nodeCacheCapable)."""
        pod = args.get("Pod")
        if not isinstance(pod, dict):
            return {"NodeNameToMetaVictims": {}}
        given, given_pdb = _given(args)
        try:
            request = placement_request(pod)
        except RequestError:
            return {"NodeNameToMetaVictims": {}}
        if not request.wants_gpus:  # nothing of ours to add: kube-scheduler's victims as they are
            return {"NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid} for uid in sorted(uids)],
                                                     "NumPDBViolations": given_pdb.get(node, 0)}
                                              for node, uids in given.items()}}
        snap = self.state.snapshot()
        traits = snap.pods.pod_traits(_now(), await self._protected(snap))
        choice = preemption(snap, request, pod_priority(pod), list(given), traits, given)
        if choice.quota is not None:
            self.metrics.preemptions.labels(OVER_QUOTA).inc()
            return {"NodeNameToMetaVictims": {}}
        self.metrics.preemptions.labels(PROPOSED if choice.found
                                        else NOT_HELPFUL).inc()
        return {"NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in sorted(given.get(node, frozenset()))]
                   + [{"UID": p.uid} for p in victims.pods if p.uid not in given.get(node, frozenset())],
                   "NumPDBViolations": given_pdb.get(node, 0) + victims.pdb_violations}
            for node, victims in choice.found.items()}}

    # ---- the extender's own preemption ----------------------------------------------------------

    def consider(self, pod: dict[str, Any], request: PodRequest, names: list[str]) -> None:
        """Filter found the pod fits none of `names`: preempt for it in the background, unless it
        may not (preemptionPolicy Never), is being served already, or its victims are still going."""
        key = pod_key(request.namespace, request.name)
        if key in self._busy or not request.wants_gpus:
            return
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            self._count_once(key, POLICY_NEVER)
            return
        if self.kube is None:
            return
        snap = self.state.snapshot()
        if not snap.pods.may_preempt(pod_priority(pod)):
            return  # no bound pod of lower priority anywhere: nothing to search (the usual case)
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated and snap.pods.deleting.get(nominated):
            return  # its victims are still terminating: wait for them (kube-scheduler's rule too)
        self._busy.add(key)
        task = asyncio.get_running_loop().create_task(self._preempt(pod, request, names))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _t: self._busy.discard(key))

    async def _preempt(self, pod: dict[str, Any], request: PodRequest, names: list[str]) -> None:
        key = pod_key(request.namespace, request.name)
        snap = self.state.snapshot()
        try:
            protected = await self._protected(snap)
        except ApiError as error:
            log.warning("preemption for %s: PodDisruptionBudgets cannot be read (%s); not preempting", key, error)
            return
        snap = self.state.snapshot()  # the read above awaited: decide on the state as it is now
        priority = pod_priority(pod)
        started = asyncio.get_running_loop().time()
        choice = preemption(snap, request, priority, names, snap.pods.pod_traits(_now(), protected), cheapest_only=True)
        self.metrics.preemption_latency.observe(asyncio.get_running_loop().time() - started)
        best = choice.best
        if choice.quota is not None or best is None:
            await self._not_helpful(pod, key, choice)
            return
        self._told.pop(key, None)
        node = snap.inventories[best.node]
        for victim in best.pods:
            await self._evict(victim, pod, node, best)
        if best.pods:
            await self._seen_going(best.node, [victim.key for victim in best.pods])
            self.metrics.preemptions.labels(EVICTED).inc()
            self.metrics.victims.observe(len(best.pods))
            await post_event(self.kube, _involved(pod), reason=PREEMPTED_SLICES_REASON, event_type="Normal",
                             component=COMPONENT, message=_preemptor_message(node, best))
        await self._nominate(pod, best.node)

    async def _evict(self, victim: Occupant, preemptor: dict[str, Any], node: NodeInventory, best: Victims) -> None:
        namespace, _, name = victim.key.partition("/")
        path = object_path("v1", "pods", name, namespace=namespace)
        freed = _slices(node, victim)
        who = f"{preemptor['metadata'].get('namespace')}/{preemptor['metadata'].get('name')}"
        message = (f"rocshare-scheduler: preempted by {who} (priority {pod_priority(preemptor)}) "
                   f"on node {best.node}, freeing {freed}")
        condition = {"type": "DisruptionTarget", "status": "True", "reason": DISRUPTION_REASON,
                     "message": message[:1024], "lastTransitionTime": _now().strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            await self.kube.request("PATCH", path + "/status", body={"status": {"conditions": [condition]}},
                                    content_type=STRATEGIC_MERGE)
            await self.kube.request("DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                          "preconditions": {"uid": victim.uid}})
        except NotFound:
            return  # gone already
        except ApiError as error:
            log.warning("preemption: could not evict %s: %s", victim.key, error)
            return
        await post_event(self.kube, {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                                     "uid": victim.uid}, reason=PREEMPTED_REASON, message=message,
                         component=COMPONENT)

    async def _seen_going(self, node: str, keys: list[PodKey], timeout_s: float = SEEN_GOING_S) -> None:
        """Until the pod watch shows every victim deleting or gone (bounded): the pod stays `_busy`
        meanwhile, so its next filter decides with the victims taken as going, never choosing more
        because the watch lagged behind the deletes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pods = self.state.pods
        while loop.time() < deadline:
            if all(key in pods.deleting.get(node, ()) or key not in pods.traits for key in keys):
                return
            await asyncio.sleep(0.05)
        log.warning("preemption: the watch has not shown %s going after %.0f s", ", ".join(keys), timeout_s)

    async def _nominate(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        path = object_path("v1", "pods", meta["name"], namespace=meta.get("namespace")) + "/status"
        try:
            await self.kube.request("PATCH", path, body={"metadata": {"uid": meta.get("uid")},
                                                         "status": {"nominatedNodeName": node}},
                                    content_type=STRATEGIC_MERGE)
        except ApiError as error:
            log.warning("preemption: could not nominate %s/%s to %s: %s", meta.get("namespace"), meta["name"], node,
                        error)

    async def _not_helpful(self, pod: dict[str, Any], key: PodKey, choice: PreemptionChoice) -> None:
        over = choice.quota is not None
        label, reason = (OVER_QUOTA, OVER_QUOTA_REASON) if over else (NOT_HELPFUL, NOT_HELPFUL_REASON)
        if choice.quota is not None:
            message = f"rocshare-scheduler: not preempting: the pod is over its namespace's quota ({choice.quota})"
        else:
            counts: dict[str, int] = {}
            for why in choice.refused.values():
                counts[why] = counts.get(why, 0) + 1
            summary = ", ".join(f"{n} {why}" for why, n in sorted(counts.items())) or "no node"
            message = (f"rocshare-scheduler: preemption would not help: no set of lower-priority pods frees "
                       f"room for the whole request on any node ({summary})")
        if self._told.get(key) == message:
            return
        self._told[key] = message
        self.metrics.preemptions.labels(label).inc()
        await post_event(self.kube, _involved(pod), reason=reason, message=message, component=COMPONENT)

    def _count_once(self, key: PodKey, reason: str) -> None:
        if self._told.get(key) != reason:
            self._told[key] = reason
            self.metrics.preemptions.labels(reason).inc()

    async def _protected(self, snap: Snapshot) -> frozenset[PodKey]:
        """Bound pods whose eviction would violate a PodDisruptionBudget (read fresh: preemption is rare)."""
        if self.kube is None:
            return frozenset()
        listed = await self.kube.list(object_path("policy/v1", "poddisruptionbudgets"))
        budgets: list[Budget] = [budget_of(item) for item in listed.get("items") or ()]
        if not budgets:
            return frozenset()
        namespaces = {budget.namespace for budget in budgets}
        pods = [(key, facts.namespace, dict(facts.labels)) for key, facts in sorted(snap.pods.traits.items())
                if facts.namespace in namespaces]
        return pdb_protected(pods, budgets)


def _given(args: Mapping[str, Any]) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
    """kube-scheduler's victims per node (uids) and their PDB violations, meta form or full."""
    given: dict[str, frozenset[str]] = {}
    pdb: dict[str, int] = {}
    meta = args.get("NodeNameToMetaVictims")
    full = args.get("NodeNameToVictims")
    for node, victims in (meta or full or {}).items():
        victims = victims or {}
        uids = [str(p.get("UID") or "") if meta else str(((p or {}).get("metadata") or {}).get("uid") or "")
                for p in victims.get("Pods") or ()]
        given[str(node)] = frozenset(uid for uid in uids if uid)
        pdb[str(node)] = int(victims.get("NumPDBViolations") or 0)
    return given, pdb


def _slices(node: NodeInventory, victim: Occupant) -> str:
    parts = []
    for pos, usage in victim.gpus:
        spec = node.gpus[pos]
        what = "the whole device" if usage.whole else f"{usage.memory_mib} MiB, {usage.cu_held} of {spec.cu_count} CUs"
        parts.append(f"GPU {spec.gpu_id} ({what})")
    return "; ".join(parts) or "no GPU"


def _preemptor_message(node: NodeInventory, best: Victims) -> str:
    evicted = "; ".join(f"{p.key} (priority {p.priority}): {_slices(node, p)}" for p in best.pods)
    return f"rocshare-scheduler: preempted {len(best.pods)} pod(s) on node {best.node} to make room: {evicted}"


def _involved(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    found = {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""), "namespace": meta.get("namespace", "")}
    if meta.get("uid"):
        found["uid"] = meta["uid"]
    return found


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
