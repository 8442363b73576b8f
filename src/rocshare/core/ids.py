"""Typed identifiers shared by the core modules.

They are plain strings at run time; the NewTypes only keep a node name from being passed
where a GPU id is expected.
"""

from __future__ import annotations

from typing import NewType

NodeName = NewType("NodeName", str)
GpuId = NewType("GpuId", str)
PodKey = NewType("PodKey", str)
"""``namespace/name`` of a pod."""


def pod_key(namespace: str, name: str) -> PodKey:
    return PodKey(f"{namespace}/{name}")


CLAIM_KEY_KIND = "resourceclaim"


def claim_key(namespace: str, name: str) -> PodKey:
    """A ResourceClaim's key among the pods' (``<namespace>/resourceclaim/<name>``: a pod's name has no
    slash, so the two never meet); status lists its holder as ``resourceclaim/<name>``."""
    return PodKey(f"{namespace}/{CLAIM_KEY_KIND}/{name}")
