"""Resize: the leader decides a running pod's resize request as bind decides a placement.

A pod carrying a request (rocshare.api.resize) newer than its record's ``resizeGeneration`` is
decided by the replica that decides binds (the decision gate, leadership.py), from the same
snapshot bind reads, by rocshare.core.resize. Then:

1. the ledger takes the *covering* record (the larger of before and after, core/resize.py) in the
   place of the pod's current one, before anything is written, so no bind meanwhile hands a
   neighbour the room either record holds, and nothing counts twice;
2. the new record (and HAMi's companion annotations) is merge-patched on the pod under its
   resourceVersion: written only if the pod is as it was read. A Conflict puts the old record
   back and decides again from a fresh read; a refusal puts it back and stops; an unknown outcome
   is settled by a read;
3. the watch's echo of the new record replaces the covering one (Accounts.replace), and every
   reader -- quota, share status, metrics -- follows it;
4. the pod's condition ``rocshare.io/Resized`` says which generation was applied (True) or why
   it was refused (False, a ``Resize*`` reason), and an Event says the same.

What was answered is remembered per pod (uid, request text), so one request is decided once per
replica; a new leader decides again only a request whose record does not show it applied (its
answer is the same condition, rewritten).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, decode_record, \
    encode_record
from rocshare.api.hami import POD_DEVICES_ANNOTATION, companion_annotations
from rocshare.api.resize import RESIZE_ANNOTATION, RESIZED_CONDITION, RESIZED_REASON, ResizeError, \
    ResizeRequest, answers, condition_message, decode_request
from rocshare.core.ids import PodKey, pod_key
from rocshare.core.ledger import EMPTY_GPU, GpuUsage, add_usage
from rocshare.core.resize import DRA_CLAIM_REASON, DRA_MESSAGE, INVALID_REQUEST_REASON, Neighbours, Refusal, \
    Resized, covering, decide_resize
from rocshare.kube.client import ApiError, Conflict, Kube, NotFound, object_path
from rocshare.kube.events import post_event
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.feed.cluster_facts import PodFacts
from rocshare_operator.leadership import DecisionGate, NotDeciding

log = logging.getLogger(__name__)

COMPONENT = "rocshare-extender"
ATTEMPTS = 3
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
ANSWERED_MAX = 10_000


@dataclass
class Resizer:
    kube: Kube
    state: SchedulerState
    gate: DecisionGate = field(default_factory=DecisionGate)
    _answered: dict[PodKey, tuple[str, str]] = field(default_factory=dict)
    _busy: dict[PodKey, bool] = field(default_factory=dict)
    """Pods being decided -> whether an event came meanwhile (then it is decided again after)."""
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _synced: bool = False
    """Set by `run` (started once the caches are full): no request is decided from partial ones."""

    def on_pod(self, pod: PodFacts) -> None:
        """From the pod watch (SchedulerState.on_resize): decide a request not yet answered here."""
        if not self._synced or not self.gate.deciding() or pod.deleting or not pod.node or pod.resize is None:
            return
        if self._answered.get(pod.key) == (pod.uid, pod.resize):
            return
        if pod.key in self._busy:
            self._busy[pod.key] = True
            return
        self._busy[pod.key] = False
        task = asyncio.get_running_loop().create_task(self._decide_soon(pod))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        """Whenever this replica starts deciding, look again at every pod carrying a request."""
        self._synced = True
        while True:
            if self.gate.deciding():
                for pod in list(self.state.resize_asked.values()):
                    self.on_pod(pod)
            await self.gate.wait_changed()

    async def _decide_soon(self, pod: PodFacts) -> None:
        key = pod.key
        try:
            while True:
                await self.gate.run(lambda: self.decide(pod.namespace, pod.name, pod.uid))
                if not self._busy.get(key):
                    return
                self._busy[key] = False
        except NotDeciding:
            return
        except Exception:  # noqa: BLE001 -- a background task: logged, and the next event tries again
            log.exception("resize of %s failed", key)
            self._answered.pop(key, None)
        finally:
            self._busy.pop(key, None)

    async def decide(self, namespace: str, name: str, uid: str) -> None:
        """Decide the pod's request as it is now in the API server, and answer it."""
        path = object_path("v1", "pods", name, namespace=namespace)
        key = pod_key(namespace, name)
        for _attempt in range(ATTEMPTS):
            try:
                pod = await self.kube.get(path)
            except NotFound:
                return
            meta = pod["metadata"]
            if uid and meta.get("uid") != uid:
                return
            annotations = meta.get("annotations") or {}
            text = annotations.get(RESIZE_ANNOTATION)
            if text is None:
                return
            done = await self._decide_read(key, path, pod, text, annotations.get(ALLOCATION_ANNOTATION))
            if done:
                self._remember(key, meta.get("uid") or "", text)
                return
        log.info("resize of %s: the pod kept changing (%d attempts); the next event tries again", key, ATTEMPTS)

    async def _decide_read(self, key: PodKey, path: str, pod: dict, text: str, record_text: str | None) -> bool:
        """True when the request is answered (or needs no answer); False: the pod changed, read it again."""
        try:
            request = decode_request(text)
        except ResizeError as error:
            await self._answer(pod, 0, False, INVALID_REQUEST_REASON, str(error))
            return True
        if _answered_on(pod, request.generation):
            return True  # refused earlier (by this replica or the one that led before): it stays refused
        if record_text is None:
            if (pod.get("spec") or {}).get("resourceClaims"):
                await self._answer(pod, request.generation, False, DRA_CLAIM_REASON, DRA_MESSAGE)
                return True
            return True  # not bound with a record yet: decided once bind has written one (its event)
        try:
            record = decode_record(record_text)
        except AllocationError as error:
            await self._answer(pod, request.generation, False, INVALID_REQUEST_REASON, str(error))
            return True
        if request.generation <= record.generation:
            return True  # applied already (this replica or another)
        decided = self._decision(key, pod["metadata"].get("namespace", ""), record, request)
        if isinstance(decided, Refusal):
            await self._answer(pod, request.generation, False, decided.reason, decided.message)
            return True
        written = await self._write(key, path, pod, record, decided.record)
        if written:
            await self._answer(pod, request.generation, True, RESIZED_REASON, decided.summary)
        return written

    def _decision(self, key: PodKey, namespace: str, record: AllocationRecord,
                  request: ResizeRequest) -> Resized | Refusal:
        snap = self.state.snapshot()
        node = snap.inventories.get(record.node)
        if node is None:
            return Refusal(INVALID_REQUEST_REASON, f"node {record.node} reports no GPU inventory now; ask again later")
        neighbours = Neighbours(others_on(snap.ledger.holders(node), key, [gpu.gpu_id for gpu in node.gpus]),
                                snap.quota_limits(namespace), snap.quota_used(namespace))
        return decide_resize(record, request, node, neighbours)

    async def _write(self, key: PodKey, path: str, pod: dict, old: AllocationRecord, new: AllocationRecord) -> bool:
        """The new record on the pod under its resourceVersion, the covering one in the ledger meanwhile.
        True: written. False: the pod changed (the old record is accounted again)."""
        namespace = pod["metadata"].get("namespace", "")
        self.state.replace(key, namespace, covering(old, new), interim=True)
        patch = {"metadata": {"resourceVersion": pod["metadata"].get("resourceVersion", ""),
                              "annotations": self._annotations(pod, new)}}
        try:
            await self.kube.merge_patch(path, patch)
            return True
        except Conflict:
            self.state.replace(key, namespace, old)
            return False
        except NotFound:
            return True  # gone: the watch forgets it
        except ApiError as error:
            return await self._settle(key, path, namespace, old, new, error)

    async def _settle(self, key: PodKey, path: str, namespace: str, old: AllocationRecord, new: AllocationRecord,
                      error: ApiError) -> bool:
        """Was the patch written? A read tells; until one does, the covering record stays (blocked, never
        double-booked). Refused for good (4xx): the old record is accounted again."""
        if error.status < 500:
            self.state.replace(key, namespace, old)
            raise error
        try:
            now = await self.kube.get(path)
        except ApiError:
            log.error("resize of %s: writing the record failed (%s) and the pod cannot be read; the larger of "
                      "its records stays accounted until its next event", key, error)
            raise error from None
        text = ((now.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if text == encode_record(new):
            return True
        self.state.replace(key, namespace, old)
        return False

    def _annotations(self, pod: dict, record: AllocationRecord) -> dict[str, str]:
        spec = pod.get("spec") or {}
        names = [c["name"] for kind in ("initContainers", "containers") for c in spec.get(kind) or ()]
        status = self.state.gpu_status.get(record.node)
        types = {gpu.id: gpu.product for gpu in status.gpus} if status else {}
        companion = companion_annotations(record, device_types=types, container_names=names, now_s=int(time.time()))
        # HAMi's device list follows the record; its node and bind time stay as bind wrote them.
        return {ALLOCATION_ANNOTATION: encode_record(record), POD_DEVICES_ANNOTATION: companion[POD_DEVICES_ANNOTATION]}

    async def _answer(self, pod: dict, generation: int, applied: bool, reason: str, text: str) -> None:
        meta = pod["metadata"]
        path = object_path("v1", "pods", meta["name"], namespace=meta.get("namespace")) + "/status"
        message = condition_message(generation, text)
        condition = {"type": RESIZED_CONDITION, "status": "True" if applied else "False", "reason": reason,
                     "message": message, "lastTransitionTime": _now()}
        log.info("resize of %s/%s: %s: %s", meta.get("namespace"), meta["name"], reason, message)
        try:
            await self.kube.request("PATCH", path, body={"metadata": {"uid": meta.get("uid")},
                                                         "status": {"conditions": [condition]}},
                                    content_type=STRATEGIC_MERGE)
        except NotFound:
            return
        await post_event(self.kube, {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "namespace": meta.get("namespace", ""), "uid": meta.get("uid", "")},
                         reason=reason, message=message, event_type="Normal" if applied else "Warning",
                         component=COMPONENT)

    def _remember(self, key: PodKey, uid: str, text: str) -> None:
        if len(self._answered) >= ANSWERED_MAX:
            self._answered.clear()
        self._answered[key] = (uid, text)


def others_on(holders: Mapping[PodKey, list[tuple[int, GpuUsage]]], key: PodKey,
              gpu_ids: list[str]) -> dict[str, GpuUsage]:
    """GPU id -> what every pod but `key` holds of it (Ledger.holders' form: GPU position, hold)."""
    found: dict[str, GpuUsage] = {}
    for holder, holds in holders.items():
        if holder == key:
            continue
        for pos, usage in holds:
            found[gpu_ids[pos]] = add_usage(found.get(gpu_ids[pos], EMPTY_GPU), usage)
    return found


def _answered_on(pod: dict, generation: int) -> bool:
    """The pod's Resized condition already answers that generation."""
    return any(c.get("type") == RESIZED_CONDITION and answers(c.get("message") or "", generation)
               for c in (pod.get("status") or {}).get("conditions") or ())


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

