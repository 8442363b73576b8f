"""Admission decisions for pods (pure): what to default, what to refuse and why.

A pod "asks for AMD GPUs" when any container limits or requests an amd.com/gpu*
resource. Such pods are sent to rocshare's scheduler; pods that don't ask are never
touched. Refusals name the container, the resource and the rule, because the user
sees them verbatim from `kubectl apply`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rocshare.api.allocation import ALLOCATED_ANNOTATION, ALLOCATION_ANNOTATION, ALLOCATION_ERROR_ANNOTATION
from rocshare.api.dra import is_rocshare_class
from rocshare.api.node_settings import HAMI_POD_DEVICES_ANNOTATION, POOL_LABEL
from rocshare.api.resource_names import is_partition_resource
from rocshare.core.request import RequestError, parse_pod
from rocshare.core.tenant_spec import GpuContainer, pod_refusal

GPU = "amd.com/gpu"
GPU_MEMORY = "amd.com/gpumem"
GPU_MEMORY_PCT = "amd.com/gpumem-percentage"
GPU_CORES = "amd.com/gpucores"
AMD_PREFIX = "amd.com/gpu"
SYSTEM_ANNOTATIONS = (ALLOCATION_ANNOTATION, ALLOCATED_ANNOTATION, ALLOCATION_ERROR_ANNOTATION,
                      HAMI_POD_DEVICES_ANNOTATION)
"""Written only by the extender's bind and the node agent; a user who writes one could
claim capacity nobody committed, so the webhook refuses it from anyone else."""


class Refused(ValueError):
    """The pod is refused; the message is shown to the user."""


@dataclass(frozen=True)
class MutationPlan:
    scheduler_name: str | None
    runtime_class_name: str | None
    add_gpu_to: tuple[tuple[str, int], ...]
    """(container kind "containers" or "initContainers", index) that get amd.com/gpu: 1."""

    @property
    def empty(self) -> bool:
        return not (self.scheduler_name or self.runtime_class_name or self.add_gpu_to)


def containers_of(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or []):
            yield kind, index, container


def amd_resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's amd.com GPU resources: amd.com/gpu*, and partition kinds (mixed naming)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    return {key: value for key, value in merged.items() if is_amd_key(key)}


def is_amd_key(key: str) -> bool:
    return key.startswith(AMD_PREFIX) or is_partition_resource(key)


def asks_for_gpus(pod: Mapping[str, Any]) -> bool:
    return any(amd_resources(container) for _, _, container in containers_of(pod))


def plan_mutation(pod: Mapping[str, Any], *, scheduler_name: str, runtime_class_name: str | None) -> MutationPlan:
    if not asks_for_gpus(pod):
        return MutationPlan(None, None, ())
    spec = pod.get("spec") or {}
    add = tuple((kind, index) for kind, index, container in containers_of(pod)
                if _only_percentage(amd_resources(container)))
    return MutationPlan(
        scheduler_name=scheduler_name if spec.get("schedulerName") != scheduler_name else None,
        runtime_class_name=runtime_class_name if runtime_class_name and not spec.get("runtimeClassName") else None,
        add_gpu_to=add,
    )


def _only_percentage(resources: Mapping[str, Any]) -> bool:
    return GPU_MEMORY_PCT in resources and GPU not in resources and GPU_MEMORY not in resources


def apply_mutation(pod: dict[str, Any], plan: MutationPlan) -> dict[str, Any]:
    """The pod as it will be after the mutation (used to validate what will be stored)."""
    spec = dict(pod.get("spec") or {})
    if plan.scheduler_name:
        spec["schedulerName"] = plan.scheduler_name
    if plan.runtime_class_name:
        spec["runtimeClassName"] = plan.runtime_class_name
    for kind, index in plan.add_gpu_to:
        containers = [dict(container) for container in spec[kind]]
        resources = dict(containers[index].get("resources") or {})
        resources["limits"] = {**(resources.get("limits") or {}), GPU: "1"}
        containers[index] = {**containers[index], "resources": resources}
        spec[kind] = containers
    return {**pod, "spec": spec}


def validate_create(pod: Mapping[str, Any], *, trusted: bool, rocshare_claims: frozenset[str] = frozenset()) -> None:
    """Raise Refused naming the first problem of a GPU pod being created. `rocshare_claims`: the
    pod's claims (spec.resourceClaims names) that are, or may be, of rocshare's DRA class; a
    container naming one is held to the rules of a container holding a slice."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    forged = sorted(key for key in SYSTEM_ANNOTATIONS if key in annotations)
    if forged and not trusted:
        raise Refused(f"annotation {forged[0]} is written only by the rocshare scheduler and node agent; remove it")
    asks = asks_for_gpus(pod)
    spec = pod.get("spec") or {}
    if asks and spec.get("nodeName"):
        raise Refused(f"spec.nodeName ({spec['nodeName']}) would bypass the rocshare scheduler for a pod asking "
                      "for AMD GPUs; use a nodeSelector instead")
    for kind, index, container in containers_of(pod):
        _check_container(kind, index, container)
    why = pod_refusal(pod, gpu_containers(pod, rocshare_claims))
    if why is not None:
        raise Refused(why)
    if not asks:
        return
    try:
        parse_pod(pod)
    except RequestError as error:
        raise Refused(str(error)) from None


def _check_container(kind: str, index: int, container: Mapping[str, Any]) -> None:
    resources = amd_resources(container)
    if not resources:
        return
    if any(is_partition_resource(key) for key in resources):
        return  # whole partitions of one kind: parse_pod says what else may not go with them
    where = f"{kind}[{index}] ({container.get('name', '?')})"
    has_gpu = GPU in resources
    for key in (GPU_MEMORY, GPU_CORES):
        if key in resources and not has_gpu:
            raise Refused(f"{where}: {key} needs {GPU} (how many GPUs the slice is on)")


def gpu_containers(pod: Mapping[str, Any], rocshare_claims: frozenset[str] = frozenset()) -> list[GpuContainer]:
    """The containers that receive rocshare's GPUs: asking amd.com/* resources (a slice unless only
    whole GPUs or partitions), or naming one of `rocshare_claims` (held to a slice's rules: the claim
    may be one)."""
    found = []
    for kind, index, container in containers_of(pod):
        resources = amd_resources(container)
        claims = {claim.get("name") for claim in (container.get("resources") or {}).get("claims") or ()}
        names_claim = bool(claims & rocshare_claims)
        if resources or names_claim:
            asks_slice = any(key in resources for key in (GPU_MEMORY, GPU_MEMORY_PCT, GPU_CORES)) \
                and not any(is_partition_resource(key) for key in resources)
            found.append(GpuContainer(f"{kind}[{index}] ({container.get('name', '?')})", container,
                                      holds_slice=asks_slice or names_claim))
    return found


def validate_update(old: Mapping[str, Any], new: Mapping[str, Any], *, trusted: bool) -> None:
    """Only rocshare's own components may add, change or remove the allocation annotations."""
    if trusted:
        return
    before = (old.get("metadata") or {}).get("annotations") or {}
    after = (new.get("metadata") or {}).get("annotations") or {}
    for key in SYSTEM_ANNOTATIONS:
        if before.get(key) != after.get(key):
            raise Refused(f"annotation {key} is written only by the rocshare scheduler and node agent")


def claim_asks_rocshare(claim_spec: Mapping[str, Any]) -> bool:
    """True when a ResourceClaim spec asks a device of rocshare's class or of one of its shape classes
    (exactly, or among its firstAvailable alternatives)."""
    for request in (claim_spec.get("devices") or {}).get("requests") or ():
        classes = [(request.get("exactly") or {}).get("deviceClassName"),
                   *((choice or {}).get("deviceClassName") for choice in request.get("firstAvailable") or ())]
        if any(is_rocshare_class(name) for name in classes):
            return True
    return False


def runtime_class_for(pod: Mapping[str, Any], pools: Mapping[str, Any]) -> str | None:
    """The runtimeClassName of the pool the pod will land in: the one its nodeSelector names
    (label rocshare.io/pool), else the only pool there is; None when it can't be known."""
    selector = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(POOL_LABEL)
    if selector is not None:
        pool = pools.get(selector)
    elif len(pools) == 1:
        pool = next(iter(pools.values()))
    else:
        return None
    return getattr(pool, "runtime_class_name", None) if pool is not None else None
