"""How Kubernetes runs a pod, as far as rocshare's rules read it. Pure.

One place for two facts every part reads (STYLE.md 14):
* a native sidecar is an init container with ``restartPolicy: Always``: it keeps running beside
  the app containers (Kubernetes 1.29+), so its resources count with theirs;
* a pod bound to a node is awaiting allocation until that node's kubelet admits it: the kubelet
  allocates every container's devices while admitting the pod and then writes its first status,
  which sets ``status.startTime`` (or phase Failed, when it rejects the pod). The extender's
  in-flight gate and the agent's in-flight check both release on it.
"""

from __future__ import annotations

from collections.abc import Mapping


def is_sidecar(container: Mapping, *, init: bool) -> bool:
    """Whether the container (as the API server writes it) is a native sidecar."""
    return init and container.get("restartPolicy") == "Always"


def awaiting_allocation(*, phase: str, started: bool, deleting: bool) -> bool:
    """Not yet admitted by its node's kubelet (see the module docstring); a pod being deleted is
    never served again."""
    return phase == "Pending" and not started and not deleting
