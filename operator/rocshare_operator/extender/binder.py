"""Bind: the one place a scheduling decision becomes real (DESIGN.md section 2).

For one pod and the node kube-scheduler chose:
0. start from the pod as kube-scheduler sent it to filter (kept by `saw`), else read it;
1. wait (bounded) until the node has no pod in flight — bound but not yet allocated by
   its agent — so the agent can never confuse two pods' Allocate calls;
2. decide GPUs and CU ranges from the current ledger;
3. write the record on the pod with a resourceVersion precondition (a concurrent change
   to the pod, or a stale copy from filter, makes the write fail, and we decide again from
   a fresh read);
4. account it in the ledger and mark it in flight, then create the Binding;
5. if the Binding fails, take the record back off the pod and out of the ledger.
The in-flight mark is released by the pod watch (allocated, ended or deleted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, decode_record, encode_record
from rocshare.api.hami import encode_pod_devices
from rocshare.api.node_settings import HAMI_POD_DEVICES_ANNOTATION
from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey, pod_key
from rocshare.core.request import RequestError, parse_pod
from rocshare.kube.client import ApiError, Conflict, Kube, object_path
from rocshare_operator.extender.decisions import Rejection, node_rejection, policy_for
from rocshare_operator.extender.state import InFlight, SchedulerState

log = logging.getLogger(__name__)

DECISION_ATTEMPTS = 3
SEEN_PODS_MAX = 2048


class BindRefused(Exception):
    """The pod cannot be bound to that node now; the message says why (kube-scheduler retries)."""


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

    def saw(self, pod: dict) -> None:
        """Keep the pod kube-scheduler sent to filter, so bind need not read it again (bounded:
        the oldest are dropped; a pod bind finds no copy of is read from the API server)."""
        meta = pod["metadata"]
        self._seen[pod_key(meta.get("namespace", ""), meta.get("name", ""))] = pod
        if len(self._seen) > SEEN_PODS_MAX:
            self._seen.popitem(last=False)

    def forget(self, key: PodKey) -> None:
        self._seen.pop(key, None)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> AllocationRecord:
        """Commit and bind; raises BindRefused with the reason."""
        path = object_path("v1", "pods", name, namespace=namespace)
        deadline = time.monotonic() + self.wait_timeout_s
        self.queued[node] += 1
        try:
            pod = self._seen_pod(pod_key(namespace, name), uid) or await self._read_pod(path, uid)
            if _existing_record(pod) is None:
                self._decide(pod, node)  # refuse at once when it can't fit: waiting frees nothing
            async with self._locks.setdefault(node, asyncio.Lock()):
                await self._wait_for_room(node, deadline)
                record = await self._commit(path, namespace, name, uid, node, pod)
        finally:
            self.queued[node] -= 1
            if not self.queued[node]:
                del self.queued[node]
        await self._create_binding(path, namespace, name, uid, node, record)
        return record

    async def _wait_for_room(self, node: str, deadline: float) -> None:
        state = self.state
        async with state.changed:
            while node in state.inflight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    held = state.inflight[node]
                    raise BindRefused(f"node {node} is still allocating pod {held.pod}; retry later")
                try:
                    await asyncio.wait_for(state.changed.wait(), remaining)
                except TimeoutError:
                    continue

    def _seen_pod(self, key: PodKey, uid: str) -> dict | None:
        pod = self._seen.pop(key, None)
        if pod is None or (uid and pod["metadata"].get("uid") != uid) or pod.get("spec", {}).get("nodeName"):
            return None
        return pod

    async def _commit(self, path: str, namespace: str, name: str, uid: str, node: str,
                      pod: dict | None) -> AllocationRecord:
        """`pod` may be stale: the write's resourceVersion precondition catches that."""
        key = pod_key(namespace, name)
        for attempt in range(1, DECISION_ATTEMPTS + 1):
            if pod is None:
                pod = await self._read_pod(path, uid)
            existing = _existing_record(pod)
            if existing is not None:  # an earlier bind wrote it and its Binding failed or timed out
                if existing.node != node:
                    raise BindRefused(f"pod {key} is already committed to node {existing.node}")
                record = existing
            else:
                record = self._decide(pod, node)
                try:
                    await self.kube.merge_patch(path, _record_patch(pod, record, self._device_types(node)))
                except Conflict:
                    log.info("pod %s changed while binding (attempt %d); deciding again", key, attempt)
                    pod = None
                    continue
            self.state.commit(key, namespace, record)
            self.state.inflight[node] = InFlight(key, time.monotonic())
            return record
        raise BindRefused(f"pod {key} kept changing during bind ({DECISION_ATTEMPTS} attempts)")

    async def _read_pod(self, path: str, uid: str) -> dict:
        try:
            pod = await self.kube.get(path)
        except ApiError as error:
            raise BindRefused(f"cannot read the pod: {error}") from None
        if uid and pod["metadata"].get("uid") != uid:
            raise BindRefused("the pod was deleted and re-created under the same name")
        if pod.get("spec", {}).get("nodeName"):
            raise BindRefused(f"the pod is already bound to {pod['spec']['nodeName']}")
        return pod

    def _decide(self, pod: dict, node_name: str) -> AllocationRecord:
        try:
            request = parse_pod(pod)
        except RequestError as error:
            raise BindRefused(str(error)) from None
        rejection = node_rejection(self.state, request, node_name, self.state.blocked_nodes())
        if rejection is not None:
            raise BindRefused(f"node {node_name} no longer fits: {rejection.text()}")
        node = self.state.inventories[node_name]
        decision = allocate(node, self.state.ledger.usage(node), request, policy_for(self.state, node_name, request))
        if isinstance(decision, FitFailure):
            raise BindRefused(f"node {node_name} no longer fits: {Rejection.of_fit(decision).text()}")
        return decision

    def _device_types(self, node_name: str) -> dict[str, str]:
        status = self.state.gpu_status.get(node_name)
        return {gpu.id: gpu.product for gpu in status.gpus} if status else {}

    async def _create_binding(self, path: str, namespace: str, name: str, uid: str, node: str,
                              record: AllocationRecord) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if uid:
            binding["metadata"]["uid"] = uid
        try:
            await self.kube.create(path + "/binding", binding)
        except ApiError as error:
            await self._roll_back(path, namespace, name, node)
            raise BindRefused(f"binding to {node} failed: {error}") from None

    async def _roll_back(self, path: str, namespace: str, name: str, node: str) -> None:
        key = pod_key(namespace, name)
        try:
            await self.kube.merge_patch(path, {"metadata": {"annotations": {
                ALLOCATION_ANNOTATION: None, HAMI_POD_DEVICES_ANNOTATION: None}}})
        except ApiError as error:
            # The record stays on the pod and in the ledger: blocked, never double-booked.
            log.error("pod %s: could not remove the record after a failed binding: %s", key, error)
            await self.state.release_inflight(node, key)
            return
        await self.state.uncommit(key)


def _existing_record(pod: dict) -> AllocationRecord | None:
    text = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    if text is None:
        return None
    try:
        return decode_record(text)
    except AllocationError as error:
        raise BindRefused(str(error)) from None


def _record_patch(pod: dict, record: AllocationRecord, device_types: dict[str, str]) -> dict:
    spec = pod.get("spec", {})
    names = [c["name"] for c in spec.get("initContainers", [])] + [c["name"] for c in spec.get("containers", [])]
    return {"metadata": {
        "resourceVersion": pod["metadata"]["resourceVersion"],
        "annotations": {
            ALLOCATION_ANNOTATION: encode_record(record),
            HAMI_POD_DEVICES_ANNOTATION: encode_pod_devices(record, device_types=device_types, container_names=names),
        },
    }}
