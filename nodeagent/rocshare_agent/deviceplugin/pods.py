"""The node's pods, from the API server: a list+watch cache and the agent's refusal annotation.

The cache holds every pod bound to this node (field selector ``spec.nodeName``), rebuilt from
a fresh list whenever the watch breaks or expires, so a restarted agent knows the same as a
running one. Writes are merge patches with the pod's uid as precondition (a namesake created
after a delete is never marked). Serving a pod writes nothing: the kubelet's own status
write says it was admitted (inflight.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rocshare.api.allocation import ALLOCATION_ERROR_ANNOTATION
from rocshare.kube.client import ApiError, Kube, object_path
from rocshare_agent.deviceplugin.inflight import PodRef

log = logging.getLogger(__name__)
RETRY_DELAYS_S = (0.5, 1, 2, 5, 10)


class KubePods:
    def __init__(self, kube: Kube, node_name: str) -> None:
        self._kube = kube
        self._node_name = node_name
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self._event = asyncio.Event()  # set and replaced on every watch event
        self.synced = asyncio.Event()

    @property
    def _selector(self) -> str:
        return f"spec.nodeName={self._node_name}"

    def cached(self) -> Sequence[Mapping[str, Any]]:
        return list(self._pods.values())

    async def next_event(self, timeout_s: float) -> bool:
        """Wait for the next watch event; False after `timeout_s` without one."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def fresh(self) -> Sequence[Mapping[str, Any]]:
        reply = await self._kube.list(object_path("v1", "pods"), fieldSelector=self._selector)
        self._replace(reply.get("items") or [])
        return self.cached()

    async def mark_refused(self, pod: PodRef, reason: str) -> None:
        try:
            await self._annotate(pod, {ALLOCATION_ERROR_ANNOTATION: reason})
        except ApiError as error:  # the refusal itself still reaches the kubelet
            log.warning("could not record the refusal on pod %s: %s", pod, error)

    async def warn(self, pod: PodRef, reason: str, message: str) -> None:
        """A Warning event on the pod, from this node (the node-agent policy admits it by
        source.host); a failure is logged, never raised: the container starts regardless."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace,
                               "uid": pod.uid},
            "reason": reason, "message": message, "type": "Warning",
            "source": {"component": "rocshare-agent", "host": self._node_name},
            "reportingComponent": "rocshare-agent", "reportingInstance": self._node_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self._kube.create(object_path("v1", "events", namespace=pod.namespace), event)
        except ApiError as error:
            log.warning("could not post %s on pod %s: %s", reason, pod, error)

    async def _annotate(self, pod: PodRef, annotations: dict[str, str | None]) -> dict[str, Any]:
        patch = {"metadata": {"uid": pod.uid, "annotations": annotations}}
        return await self._kube.merge_patch(object_path("v1", "pods", pod.name, namespace=pod.namespace), patch)

    # ---- list + watch ------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the cache current until cancelled; retries with backoff, logging each attempt."""
        attempt = 0
        while True:
            try:
                await self._list_and_watch()
                attempt = 0
            except ApiError as error:
                delay_s = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
                attempt += 1
                log.warning("pod watch for node %s failed (attempt %d): %s; retrying in %.1f s",
                            self._node_name, attempt, error, delay_s)
                await asyncio.sleep(delay_s)

    async def _list_and_watch(self) -> None:
        reply = await self._kube.list(object_path("v1", "pods"), fieldSelector=self._selector)
        self._replace(reply.get("items") or [])
        self.synced.set()
        version = reply["metadata"]["resourceVersion"]
        async for event in self._kube.watch(object_path("v1", "pods"), resource_version=version,
                                            fieldSelector=self._selector):
            if event.type == "ERROR":
                return  # e.g. 410 Gone: list again
            if event.type == "DELETED":
                self._pods.pop(event.object["metadata"].get("uid", ""), None)
            elif event.type in ("ADDED", "MODIFIED"):
                self._store(event.object)
            self._event.set()
            self._event = asyncio.Event()

    def _replace(self, items: list[dict[str, Any]]) -> None:
        self._pods = {item["metadata"]["uid"]: item for item in items}

    def _store(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        current = self._pods.get(uid)
        if current is not None and _older(pod, current):
            return  # a watch event older than our own patch reply
        self._pods[uid] = pod


def _older(pod: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    # resourceVersion is opaque by contract, but etcd-backed servers hand out increasing
    # integers; when it does not parse, the newest delivery wins.
    try:
        return int(pod["metadata"]["resourceVersion"]) < int(than["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return False
