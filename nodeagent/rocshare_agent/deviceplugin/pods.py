"""The node's pods, from the API server: a cache and the agent's refusal annotation.

The cache holds every pod bound to this node (field selector ``spec.nodeName``), kept by the
process's one watch primitive, `rocshare.kube.Informer` (paged lists, a relist after 410 Gone
that reports vanished pods as deletions, backoff with each attempt logged), so a restarted
agent knows the same as a running one. Writes are merge patches with the pod's uid as
precondition (a namesake created after a delete is never marked). Serving a pod writes
nothing: the kubelet's own status write says it was admitted (inflight.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rocshare.api.allocation import ALLOCATION_ERROR_ANNOTATION
from rocshare.kube.client import ApiError, Kube, object_path
from rocshare.kube.informer import Informer
from rocshare_agent.deviceplugin.inflight import PodRef

log = logging.getLogger(__name__)


class KubePods:
    def __init__(self, kube: Kube, node_name: str) -> None:
        self._kube = kube
        self._node_name = node_name
        self._event = asyncio.Event()  # set and replaced on every change
        self._informer: Informer[dict[str, Any]] = Informer(
            kube, object_path("v1", "pods"), self._changed, name=f"pods on {node_name}",
            field_selector=self._selector)
        self.synced = self._informer.synced

    @property
    def _selector(self) -> str:
        return f"spec.nodeName={self._node_name}"

    def cached(self) -> Sequence[Mapping[str, Any]]:
        return list(self._informer.store.values())

    async def next_event(self, timeout_s: float) -> bool:
        """Wait for the next change to the cache; False after `timeout_s` without one."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def fresh(self) -> Sequence[Mapping[str, Any]]:
        """The node's pods as the API server has them now (one list, not the cache: for a pod the
        watch has not brought yet)."""
        reply = await self._kube.list(object_path("v1", "pods"), fieldSelector=self._selector)
        return reply.get("items") or []

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        await self._informer.run()

    def _changed(self, _kind: str, _pod: dict[str, Any]) -> None:
        # The informer stores the pod once this returns; waiters look after a yield.
        self._event.set()
        self._event = asyncio.Event()

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
