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
