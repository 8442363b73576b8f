"""Posting core/v1 Events: the one way the product's own code (not Kopf's handlers) writes them.

An Event names the object it is about (`involved`: apiVersion, kind, name and, for namespaced
objects, namespace); cluster-scoped objects' Events go to the `default` namespace, as
kubectl and the kubelet do. A failed post is logged and dropped: Events are for people, and
whatever they report is also in a status or a metric.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from rocshare.kube.client import ApiError, Kube, object_path

log = logging.getLogger(__name__)

MESSAGE_MAX_CHARS = 1024


async def post_event(kube: Kube, involved: dict[str, Any], *, reason: str, message: str, component: str,
                     event_type: str = "Warning") -> None:
    namespace = involved.get("namespace") or "default"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        await kube.create(object_path("v1", "events", namespace=namespace), {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved, "reason": reason, "message": message[:MESSAGE_MAX_CHARS], "type": event_type,
            "source": {"component": component}, "reportingComponent": component, "reportingInstance": component,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        })
    except ApiError as error:
        log.warning("could not post the %s event on %s %s: %s", reason, involved.get("kind"), involved["name"], error)


def involved_object(body: dict[str, Any]) -> dict[str, Any]:
    """The involvedObject reference of an object body."""
    meta = body.get("metadata", {})
    reference = {"apiVersion": body.get("apiVersion", ""), "kind": body.get("kind", ""), "name": meta.get("name", "")}
    for field in ("namespace", "uid"):
        if meta.get(field):
            reference[field] = meta[field]
    return reference
