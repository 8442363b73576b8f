"""The parameters of the pod-defaults MutatingAdmissionPolicy (manifests/components/pod-defaults-policy).

Where the API server serves MutatingAdmissionPolicy, it sets a GPU pod's scheduler name and its
pool's RuntimeClass itself, from the ConfigMap `rocshare-admission` in the operator's namespace:
no webhook call per pod. This module says what that ConfigMap holds (`admission_params`, pure:
the same rule as `pods.runtime_class_for`) and keeps it written (`keep_published`): one write per
change of the pools, none per pod. Until it exists the policy does nothing and the webhook
mutates, so the order of start-up does not matter.

Keys: `schedulerName`; `pool.<name>` = the RuntimeClass of each pool that sets one; `onlyPool` =
that RuntimeClass when there is exactly one pool (a pod naming no pool lands in it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rocshare.kube.client import ApiError, Kube, object_path

log = logging.getLogger(__name__)
CONFIGMAP = "rocshare-admission"
FIELD_MANAGER = "rocshare-operator"
POLL_S = 2.0


def admission_params(pools: Mapping[str, Any], *, scheduler_name: str) -> dict[str, str]:
    data = {"schedulerName": scheduler_name}
    for name, pool in pools.items():
        runtime_class = getattr(pool, "runtime_class_name", None)
        if runtime_class:
            data[f"pool.{name}"] = runtime_class
    if len(pools) == 1:
        runtime_class = getattr(next(iter(pools.values())), "runtime_class_name", None)
        if runtime_class:
            data["onlyPool"] = runtime_class
    return data


async def keep_published(kube: Kube, namespace: str, params: Callable[[], dict[str, str]]) -> None:
    """Write the ConfigMap whenever `params()` changes (checked every POLL_S); retries on errors."""
    written: dict[str, str] | None = None
    path = object_path("v1", "configmaps", CONFIGMAP, namespace=namespace)
    while True:
        data = params()
        if data != written:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CONFIGMAP, "namespace": namespace,
                                 "labels": {"app.kubernetes.io/part-of": "rocshare"}},
                    "data": data}
            try:
                await kube.apply(path, body, field_manager=FIELD_MANAGER)
                written = data
                log.info("admission policy parameters written: %s", data)
            except ApiError as error:
                log.warning("could not write the admission policy parameters %s/%s: %s", namespace, CONFIGMAP, error)
        await asyncio.sleep(POLL_S)
