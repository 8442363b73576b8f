"""Bind: the one place a scheduling decision becomes real (DESIGN.md section 2).

For one pod and the node kube-scheduler chose:
0. start from the pod as kube-scheduler sent it to filter (kept by `saw`), else read it;
1. wait (bounded) until the node has no pod in flight -- bound but not yet admitted by
   its kubelet -- so the agent can never confuse two pods' Allocate calls;
2. decide GPUs and CU ranges from the current ledger, account them in the ledger and
   mark the pod in flight;
3. create the Binding carrying the record as annotations, with the pod's uid and
   resourceVersion as preconditions: the API server sets the node and the record in one
   write (pods/binding merges a Binding's annotations into the pod), so a pod is never
   bound without its record nor holds a record without being bound;
4. if the API server refuses (the pod changed, or a stale copy from filter: Conflict),
   nothing was written: take the decision back and decide again from a fresh read. If
   the outcome is unknown (timeout, server error), read the pod to learn it; until a read
   answers, the slice stays accounted (blocked, never double-booked).
The in-flight mark is released by the pod watch: the kubelet's first status write after
binding (status.startTime, or phase Failed), or the pod deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, decode_record, encode_record
from rocshare.api.hami import companion_annotations
from rocshare.core.ids import PodKey, pod_key
from rocshare.core.holdings import HostRequest, host_request, placement_request
from rocshare.core.request import PodRequest, RequestError
from rocshare.kube.client import ApiError, Conflict, Forbidden, Invalid, Kube, NotFound, object_path
from rocshare_operator.extender.decisions import bind_decision, node_rejection
from rocshare_operator.extender.preemption import pod_priority
from rocshare_operator.extender.replies import Rejection
from rocshare_operator.extender.state import SchedulerState

log = logging.getLogger(__name__)

DECISION_ATTEMPTS = 3
UNKNOWN_OUTCOME_READ_PAUSES_S = (0.2, 0.5, 1.0, 2.0, 4.0)
SETTLE_LATER_PAUSE_S = (5.0, 60.0)  # first and longest pause between reads once bind has given up
SEEN_PODS_MAX = 2048


class BindRefused(Exception):
    """The pod cannot be bound to that node now; the message says why (kube-scheduler retries)."""


@dataclass(frozen=True)
class _Decided:
    """A decision and what it was made from: this very pod object, the state at this count of changes."""

    pod: dict
    changes: int
    record: AllocationRecord


@dataclass
class Binder:
    kube: Kube
    state: SchedulerState
    wait_timeout_s: float = 25.0

    def __post_init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self.queued: Counter[str] = Counter()
        """Binds under way per node. Prioritize ranks such nodes lower: kube-scheduler does not
        count amd.com resources of pods it has sent to bind, so without this a burst would all
        pick the same best node and most binds would find it full."""
        self._seen: OrderedDict[PodKey, dict] = OrderedDict()
        self._settling: set[asyncio.Task] = set()

    def saw(self, pod: dict) -> None:
        """Keep the pod kube-scheduler sent to filter, so bind need not read it again (bounded:
        the oldest are dropped; a pod bind finds no copy of is read from the API server)."""
        meta = pod["metadata"]
        self._seen[pod_key(meta.get("namespace", ""), meta.get("name", ""))] = pod
        if len(self._seen) > SEEN_PODS_MAX:
            self._seen.popitem(last=False)

    def forget(self, key: PodKey) -> None:
        self._seen.pop(key, None)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> AllocationRecord | None:
        """Commit and bind; raises BindRefused with the reason. None: the pod asks no GPU."""
        path = object_path("v1", "pods", name, namespace=namespace)
        deadline = time.monotonic() + self.wait_timeout_s
        self.queued[node] += 1
        try:
            pod = self._seen_pod(pod_key(namespace, name), uid) or await self._read_pod(path, uid)
            early = None
            if _existing_record(pod) is None:
                request = _request(pod)
                if not request.wants_gpus:
                    await self._bind_host_only(path, pod_key(namespace, name), node, pod, request)
                    return None
                early = _Decided(pod, self.state.changes, self._decide(pod, node, request))
                # (refused at once when it can't fit: waiting frees nothing)
            async with self._locks.setdefault(node, asyncio.Lock()):
                await self._wait_for_room(node, pod_key(namespace, name), deadline)
                return await self._commit_and_bind(path, namespace, name, uid, node, pod, early)
        finally:
            self.queued[node] -= 1
            if not self.queued[node]:
                del self.queued[node]

    async def _wait_for_room(self, node: str, key: PodKey, deadline: float) -> None:
        """Until no other pod is in flight on the node (this pod may be: an attempt whose outcome
        could not be learnt left it so)."""
        held = await self.state.wait_in_flight(node, key, deadline)
        if held is not None:
            raise BindRefused(f"node {node} is still allocating pod {held.pod}; retry later")

    def _seen_pod(self, key: PodKey, uid: str) -> dict | None:
        pod = self._seen.pop(key, None)
        if pod is None or (uid and pod["metadata"].get("uid") != uid) or pod.get("spec", {}).get("nodeName"):
            return None
        return pod

    async def _commit_and_bind(self, path: str, namespace: str, name: str, uid: str, node: str,
                               pod: dict | None, early: _Decided | None = None) -> AllocationRecord:
        """`pod` may be stale: the Binding's resourceVersion precondition catches that. `early`: the
        decision bind made before it waited, taken when neither the pod nor the state changed since."""
        key = pod_key(namespace, name)
        if key in self.state.ledger:
            pod = None  # an earlier attempt's outcome is unknown: only a fresh read tells
        for attempt in range(1, DECISION_ATTEMPTS + 1):
            if pod is None:
                pod = await self._read_pod(path, uid)
                if key in self.state.ledger and _existing_record(pod) is None:
                    await self.state.uncommit(key)  # that attempt's Binding was not written
            existing = _existing_record(pod)
            if existing is not None and existing.node != node:
                raise BindRefused(f"pod {key} is already committed to node {existing.node}")
            # A record on an unbound pod (written by a rocshare before bindings carried it) is kept.
            if existing is not None:
                record = existing
            elif early is not None and early.pod is pod and early.changes == self.state.changes:
                record = early.record  # nothing changed while bind waited: the same plan
            else:
                record = self._decide(pod, node)
            self.state.commit(key, namespace, record, _host(pod))
            self.state.hold_in_flight(node, key)
            annotations = None if existing else _record_annotations(pod, record, self._device_types(node))
            try:
                await self.kube.create(path + "/binding", _binding(pod, node, annotations))
                return record
            except (Conflict, NotFound, Invalid, Forbidden) as error:  # refused: nothing was written
                await self.state.uncommit(key)
                if not isinstance(error, Conflict):
                    raise BindRefused(f"binding to {node} failed: {error}") from None
                log.info("pod %s changed while binding (attempt %d); deciding again", key, attempt)
                pod = None
            except ApiError as error:
                await self._settle_unknown_outcome(path, key, node, record, error)
                return record
        raise BindRefused(f"pod {key} kept changing during bind ({DECISION_ATTEMPTS} attempts)")

    async def _settle_unknown_outcome(self, path: str, key: PodKey, node: str, record: AllocationRecord,
                                      error: ApiError) -> None:
        """The Binding may or may not have been written: a read tells. Returns when it was (the
        decision stands); raises BindRefused when it was not or the pod is gone (the decision is
        taken back), or when no read answers: then the slice stays accounted and the pod in
        flight (blocked, never double-booked) and reads go on in the background until one
        answers or a later bind of the pod has replaced the decision."""
        for pause_s in UNKNOWN_OUTCOME_READ_PAUSES_S:
            await asyncio.sleep(pause_s)
            settled = await self._settled(path, key, node, record)
            if settled is None:
                continue
            if settled:
                return
            raise BindRefused(f"binding to {node} failed: {error}")
        log.error("pod %s: binding to %s failed (%s) and the pod could not be read; its slice stays "
                  "accounted until a read tells whether the Binding was written", key, node, error)
        task = asyncio.create_task(self._settle_later(path, key, node, record))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        raise BindRefused(f"binding to {node} failed: {error}")

    async def _settle_later(self, path: str, key: PodKey, node: str, record: AllocationRecord) -> None:
        pause_s, longest_s = SETTLE_LATER_PAUSE_S
        while self.state.ledger.record(key) is record:
            await asyncio.sleep(pause_s)
            if await self._settled(path, key, node, record) is not None:
                log.info("pod %s: the outcome of its binding to %s is settled", key, node)
                return
            pause_s = min(2 * pause_s, longest_s)

    async def _settled(self, path: str, key: PodKey, node: str, record: AllocationRecord) -> bool | None:
        """True: the Binding was written (the decision stands). False: it was not, or the pod is
        gone; the decision is taken back. None: no answer, or a later bind replaced the decision."""
        try:
            pod = await self.kube.get(path)
        except NotFound:
            pod = None  # gone: whatever was written, it holds nothing now
        except ApiError:
            return None
        if self.state.ledger.record(key) is not record:
            return None
        if pod is not None and pod.get("spec", {}).get("nodeName") == node and _existing_record(pod) is not None:
            return True
        await self.state.uncommit(key)
        return False

    async def _read_pod(self, path: str, uid: str) -> dict:
        """The pod as the API server has it now. A pod found bound has its record put in the
        ledger before bind refuses (the watch may not have shown it yet)."""
        try:
            pod = await self.kube.get(path)
        except ApiError as error:
            raise BindRefused(f"cannot read the pod: {error}") from None
        meta = pod["metadata"]
        if uid and meta.get("uid") != uid:
            raise BindRefused("the pod was deleted and re-created under the same name")
        bound_to = pod.get("spec", {}).get("nodeName")
        if bound_to:
            record = _existing_record(pod)
            if record is not None:
                self.state.commit(pod_key(meta.get("namespace", ""), meta["name"]), meta.get("namespace", ""), record,
                                  _host(pod))
            raise BindRefused(f"the pod is already bound to {bound_to}")
        return pod

    async def _bind_host_only(self, path: str, key: PodKey, node: str, pod: dict, request: PodRequest) -> None:
        """A pod that asks no GPU (the profile sends the extender every pod asking CPU, so that the
        policy ranks it): a plain Binding, no record and no in-flight mark (the kubelet allocates
        it no device); its CPU and memory are accounted at once, taken back if the Binding fails."""
        rejection = node_rejection(self.state.snapshot(), request, node)
        if rejection is not None:
            raise BindRefused(f"node {node} no longer fits: {rejection.text()}")
        self.state.commit_host(key, node, HostRequest(request.cpu_milli, request.memory_mib))
        try:
            await self.kube.create(path + "/binding", _binding(pod, node, None))
        except ApiError as error:
            await self.state.uncommit(key)
            raise BindRefused(f"binding to {node} failed: {error}") from None

    def _decide(self, pod: dict, node_name: str, request: PodRequest | None = None) -> AllocationRecord:
        """The record to commit on the node now (planned afresh), or BindRefused saying why not."""
        decision = bind_decision(self.state.snapshot(), request or _request(pod), node_name, pod_priority(pod))
        if isinstance(decision, Rejection):
            raise BindRefused(f"node {node_name} no longer fits: {decision.text()}")
        return decision

    def _device_types(self, node_name: str) -> dict[str, str]:
        status = self.state.gpu_status.get(node_name)
        return {gpu.id: gpu.product for gpu in status.gpus} if status else {}

def _host(pod: dict) -> HostRequest:
    try:
        return host_request(pod.get("spec") or {})
    except RequestError as error:
        raise BindRefused(str(error)) from None


def _request(pod: dict) -> PodRequest:
    try:
        return placement_request(pod)
    except RequestError as error:
        raise BindRefused(str(error)) from None


def _existing_record(pod: dict) -> AllocationRecord | None:
    text = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    if text is None:
        return None
    try:
        return decode_record(text)
    except AllocationError as error:
        raise BindRefused(str(error)) from None


def _record_annotations(pod: dict, record: AllocationRecord, device_types: dict[str, str]) -> dict[str, str]:
    """The record, and what a HAMi scheduler needs to count the pod (rocshare.api.hami)."""
    spec = pod.get("spec", {})
    names = [c["name"] for c in spec.get("initContainers", [])] + [c["name"] for c in spec.get("containers", [])]
    return {
        ALLOCATION_ANNOTATION: encode_record(record),
        **companion_annotations(record, device_types=device_types, container_names=names, now_s=int(time.time())),
    }


def _binding(pod: dict, node: str, annotations: dict[str, str] | None) -> dict:
    """A Binding the API server applies only to this very pod (uid) as we read it (resourceVersion)."""
    meta = pod["metadata"]
    binding_meta = {"name": meta["name"], "namespace": meta.get("namespace", ""), "uid": meta.get("uid", ""),
                    "resourceVersion": meta.get("resourceVersion", "")}
    if annotations:
        binding_meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Binding", "metadata": binding_meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
