"""Which pod and container a kubelet Allocate call is for (DESIGN.md section 2, rule 3).

The kubelet's Allocate carries device IDs but no pod. The extender keeps at most one pod in
flight per node (bound, record committed, not yet admitted by the kubelet: no
status.startTime, not Failed), so the call belongs to that pod; the kubelet serves a pod's containers in order, init containers first, which is
also the record's order. Everything here is pure: pods are the API server's dicts.

Invariants: a request is served only when exactly one pod is in flight, its record decodes,
names this node and agrees with the pod's own limits, and the next unserved container asks for
as many devices as the kubelet sends. Anything else is a `Refusal` naming what did not match;
`Refusal.pod` is the pod to annotate with the reason, when one can be told apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rocshare.api.pod_lifecycle import awaiting_allocation as pod_awaiting_allocation
from rocshare.api.allocation import (
    ALLOCATION_ANNOTATION,
    AllocationRecord,
    ContainerAllocation,
)
from rocshare.core.holdings import asked_devices, committed_devices, read_record
from rocshare.core.request import RequestError, parse_pod

RESOURCE_NAME = "amd.com/gpu"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class InFlightPod:
    pod: PodRef
    record: AllocationRecord


class Refusal(Exception):
    """The request cannot be served; the message says why, for the pod's status and events."""

    def __init__(self, message: str, pod: PodRef | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.pod = pod


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod["metadata"]
    return PodRef(meta.get("namespace", ""), meta["name"], meta.get("uid", ""))


def pod_gpu_containers(pod: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(name, GPU count) of every container asking for GPUs, init containers first: the pod's
    request as the extender read it (quantities as the API server writes them, "1k" too). A pod
    whose request cannot be read is refused, naming the problem."""
    try:
        return asked_devices(parse_pod(pod))
    except RequestError as error:
        raise Refusal(f"pod {pod_ref(pod)}: {error}", pod_ref(pod)) from None


def awaiting_allocation(pod: Mapping[str, Any], node_name: str) -> bool:
    """Bound here and not yet admitted by the kubelet: the core's one rule
    (rocshare.api.pod_lifecycle), which the extender's in-flight gate reads too."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (pod.get("spec") or {}).get("nodeName") == node_name and pod_awaiting_allocation(
        phase=status.get("phase") or "Pending", started=bool(status.get("startTime")),
        deleting=bool(meta.get("deletionTimestamp")))


def _asks_gpus(pod: Mapping[str, Any]) -> bool:
    try:
        return bool(pod_gpu_containers(pod))
    except Refusal:
        return True  # unreadable: it may ask, and it must not be mistaken for a GPU-less pod


def find_in_flight(pods: Iterable[Mapping[str, Any]], node_name: str) -> InFlightPod:
    return _in_flight_of([pod for pod in pods if awaiting_allocation(pod, node_name)], node_name)


class InFlightFinder:
    """`find_in_flight` for one node, its last answer kept while the pods awaiting allocation are
    the same objects (uid and resourceVersion): the kubelet asks about them twice per container
    (GetPreferredAllocation, then Allocate), and each answer reads the pod's request and record."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._versions: tuple[tuple[str, str], ...] | None = None
        self._answer: InFlightPod | Refusal | None = None

    def find(self, pods: Iterable[Mapping[str, Any]]) -> InFlightPod:
        waiting = [pod for pod in pods if awaiting_allocation(pod, self.node_name)]
        versions = tuple((pod["metadata"].get("uid", ""), pod["metadata"].get("resourceVersion", "")) for pod in waiting)
        if versions != self._versions:
            try:
                self._answer = _in_flight_of(waiting, self.node_name)
            except Refusal as refusal:
                self._answer = refusal
            self._versions = versions
        if isinstance(self._answer, Refusal):
            raise Refusal(self._answer.message, self._answer.pod)
        return self._answer


def _in_flight_of(awaiting: list[Mapping[str, Any]], node_name: str) -> InFlightPod:
    """The one committed pod among those awaiting allocation on the node, or a Refusal."""
    waiting = [pod for pod in awaiting if _asks_gpus(pod)]
    committed = [pod for pod in waiting if ALLOCATION_ANNOTATION in pod["metadata"].get("annotations", {})]
    if not committed:
        suspect = pod_ref(waiting[0]) if len(waiting) == 1 else None
        raise Refusal(f"no pod in flight on node {node_name}: no pod bound here carries a committed "
                      f"{ALLOCATION_ANNOTATION} record (was it scheduled by rocshare?)", suspect)
    if len(committed) > 1:
        names = ", ".join(sorted(str(pod_ref(pod)) for pod in committed))
        raise Refusal(f"{len(committed)} pods in flight on node {node_name} ({names}); expected one, "
                      f"refusing rather than guessing")
    return _committed(committed[0], node_name)


def _committed(pod: Mapping[str, Any], node_name: str) -> InFlightPod:
    ref = pod_ref(pod)
    record, holding = read_record(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION], node_name)
    if record is None:
        raise Refusal(f"pod {ref}: {holding.problem}", ref)
    _check_matches_pod(record, pod, ref)
    return InFlightPod(ref, record)


def _check_matches_pod(record: AllocationRecord, pod: Mapping[str, Any], ref: PodRef) -> None:
    asked = pod_gpu_containers(pod)
    committed = committed_devices(record)
    if asked != committed:
        raise Refusal(f"pod {ref}: record commits {_describe(committed)} but the pod asks {_describe(asked)}", ref)


def _describe(pairs: list[tuple[str, int]]) -> str:
    return ", ".join(f"{name}={count}" for name, count in pairs) or "no GPUs"


def next_container(in_flight: InFlightPod, served: int, device_count: int) -> ContainerAllocation:
    """The record's container the kubelet is allocating now, given `served` already done."""
    containers = in_flight.record.containers
    if served >= len(containers):
        raise Refusal(f"pod {in_flight.pod}: all {len(containers)} GPU containers were already served", in_flight.pod)
    container = containers[served]
    if len(container.devices) != device_count:
        raise Refusal(f"pod {in_flight.pod}: kubelet asks {device_count} {RESOURCE_NAME} for the next container, "
                      f"but container {container.name} was committed {len(container.devices)}", in_flight.pod)
    return container
