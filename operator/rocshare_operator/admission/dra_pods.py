"""Admission of HAMi-style GPU pods into DRA pools (pure): the amd.com/* limits become a claim.

A pod "goes to a DRA pool" when every AmdGpuPool it can land on serves DRA (agent.interface DRA).
The pools it can land on are read from its nodeSelector and its required node affinity:
``rocshare.io/pool: <name>`` names one pool; otherwise every pool whose own nodeSelector does not
contradict the pod's (same key, another value), and of those the ones some required affinity term
allows (no In, NotIn or DoesNotExist expression on the pool label or on a label of the pool's
nodeSelector rules it out). Preferred affinity is not read. When those pools mix DRA and the device plugin, the
pod is refused with the pools named (it would land on device-plugin nodes only, silently), and
the user names one with ``rocshare.io/pool``. No DRA pool among them: the pod is left to the device
plugin path as before.

The claim of each GPU container is rocshare.core.dra_claims.claim_spec for the GPU shapes of the
DRA pools (from their nodes' AmdGpuNode status). It is delivered as a ResourceClaimTemplate in the
pod's namespace named by a hash of the claim spec, so equal requests share one template and
writing it again is harmless; the DeviceClasses of the GPU shapes a percentage request names are
written before it, the same way. The pod keeps its other resources; its amd.com/* entries go.

Invariants: a mutated pod asks no amd.com/* resource (nothing left for the device-plugin path to
count); each GPU container references exactly one pod claim of its own; template names depend only
on the claim spec. A request no GPU of the pools can ever hold is refused here, not left Pending.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocshare.api.dra_request import ContainerLimits, DraRequest
from rocshare.api.models import AgentInterface, AmdGpuPoolSpec
from rocshare.api.node_settings import POOL_LABEL
from rocshare.core.dra_claims import claim_spec, shape_classes_of
from rocshare.core.inventory import GpuSpec
from rocshare.core.request import ContainerRequest, RequestError, parse_pod
from rocshare_operator.admission.pods import Refused, amd_resources, containers_of, is_amd_key

MIXED_POOLS_REASON = "MixedPoolInterfaces"
UNSATISFIABLE_REASON = "DraRequestUnsatisfiable"
TEMPLATE_PREFIX = "rocshare-gpu-"
POD_CLAIM_PREFIX = "rocshare-gpu-"
MANAGED_LABELS = {"app.kubernetes.io/managed-by": "rocshare"}
_HASH_CHARS = 16


@dataclass(frozen=True)
class DraPlan:
    """What admission writes for a pod going to DRA pools."""

    pools: tuple[str, ...]
    templates: tuple[dict, ...]
    """ResourceClaimTemplates to create in the pod's namespace (each one once, by name)."""
    spec: dict
    """The pod's spec with amd.com/* removed and the claims added."""
    request: DraRequest | None = None
    """The amd.com/* limits it removed, per container (rocshare.api.dra_request: the pod's
    annotation, read by the extender's score for DRA pods); None when it removed none."""
    device_classes: tuple[dict, ...] = ()
    """The DeviceClasses of GPU shapes the templates name (dra_claims.shape_device_class), to create
    before them (cluster-wide, each once, by name: an existing one is the same)."""


def dra_pools_for(pod: Mapping[str, Any], pools: Mapping[str, AmdGpuPoolSpec]) -> tuple[str, ...]:
    """The DRA pools the pod goes to (sorted); () when it goes to the device plugin path.
    Raises Refused when the pools it can land on mix both."""
    candidates = _candidate_pools(pod, pools)
    dra = sorted(name for name, pool in candidates.items() if pool.agent.interface == AgentInterface.DRA)
    if not dra:
        return ()
    plugin = sorted(set(candidates) - set(dra))
    if plugin:
        raise Refused(f"{MIXED_POOLS_REASON}: the pod's nodeSelector and node affinity allow pools serving DRA "
                      f"({', '.join(dra)}) and pools serving the device plugin ({', '.join(plugin)}); add nodeSelector "
                      f"{POOL_LABEL}: <pool> to choose one")
    return tuple(dra)


def _candidate_pools(pod: Mapping[str, Any], pools: Mapping[str, AmdGpuPoolSpec]) -> dict[str, AmdGpuPoolSpec]:
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    named = selector.get(POOL_LABEL)
    if named is not None:
        pools = {named: pools[named]} if named in pools else {}
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    return {name: pool for name, pool in pools.items()
            if all(selector.get(key, value) == value for key, value in pool.node_selector.items())
            and (not terms or any(_term_allows(term, _pool_labels(name, pool)) for term in terms))}


def _pool_labels(name: str, pool: AmdGpuPoolSpec) -> dict[str, str]:
    """The labels every node of the pool carries: its nodeSelector's and the pool label."""
    return {**pool.node_selector, POOL_LABEL: name}


def _term_allows(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A required node-affinity term does not rule the pool out: no expression on a label the pool's
    nodes all carry contradicts it (a label the pool does not fix may match some of its nodes)."""
    for expression in term.get("matchExpressions") or ():
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or ()
        if key not in labels:
            continue
        if (operator == "In" and labels[key] not in values) or (operator == "NotIn" and labels[key] in values) \
                or operator == "DoesNotExist":
            return False
    return True


def plan_dra(pod: Mapping[str, Any], pools: tuple[str, ...], shapes: Sequence[GpuSpec]) -> DraPlan:
    """The claims for `pod` (already defaulted: a lone percentage has amd.com/gpu: 1) in `pools`,
    whose GPUs have `shapes`. Raises Refused naming the problem."""
    try:
        requests = parse_pod(pod).containers
    except RequestError as error:
        raise Refused(str(error)) from None
    spec = {**(pod.get("spec") or {})}
    templates: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    claims = list(spec.get("resourceClaims") or [])
    removed: list[ContainerLimits] = []
    where_requests = zip(containers_of(pod), requests, strict=True)
    for (kind, index, container), request in where_requests:
        limits = amd_resources(container)
        if not limits:
            continue
        removed.append(ContainerLimits(kind=kind, index=index,
                                       limits={key: str(value) for key, value in limits.items()}))
        claim = _claim_for(request, pools, shapes, pod)
        template = template_body(claim)
        classes.update((body["metadata"]["name"], body) for body in shape_classes_of(claim, shapes))
        templates[template["metadata"]["name"]] = template
        pod_claim = f"{POD_CLAIM_PREFIX}{'init-' if kind == 'initContainers' else ''}{index}"
        claims.append({"name": pod_claim, "resourceClaimTemplateName": template["metadata"]["name"]})
        spec[kind] = _with_claim(spec[kind], index, pod_claim)
    spec["resourceClaims"] = claims
    return DraPlan(pools=pools, templates=tuple(templates.values()), spec=spec,
                   request=DraRequest(containers=removed) if removed else None,
                   device_classes=tuple(classes[name] for name in sorted(classes)))


def _claim_for(request: ContainerRequest, pools: tuple[str, ...], shapes: Sequence[GpuSpec],
               pod: Mapping[str, Any]) -> dict:
    where = f"container {request.name!r} (pools {', '.join(pools)})"
    if request.gpus < 1:
        raise Refused(f"{UNSATISFIABLE_REASON}: {where}: asks amd.com/* with no GPU")
    largest_mib = max((spec.memory_mib for spec in shapes if not spec.partition), default=None)
    if request.memory_mib is not None and largest_mib is not None and request.memory_mib > largest_mib:
        raise Refused(f"{UNSATISFIABLE_REASON}: {where}: amd.com/gpumem {request.memory_mib} MiB is more than "
                      f"the largest GPU there holds ({largest_mib} MiB)")
    try:
        return claim_spec(request, shapes, selection=parse_pod(pod).selection)
    except RequestError as error:
        raise Refused(f"{UNSATISFIABLE_REASON}: {where}: {error}") from None


def template_name(claim: Mapping[str, Any]) -> str:
    """A stable name for a claim spec: equal requests in a namespace share one template."""
    digest = hashlib.sha256(json.dumps(claim, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return TEMPLATE_PREFIX + digest[:_HASH_CHARS]


def template_body(claim: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(claim), "labels": dict(MANAGED_LABELS)},
            "spec": {"spec": claim}}


def _with_claim(containers: list, index: int, pod_claim: str) -> list:
    """The containers with container `index` asking `pod_claim` instead of its amd.com/* resources."""
    changed = [dict(container) for container in containers]
    resources = dict(changed[index].get("resources") or {})
    for key in ("limits", "requests"):
        kept = {name: value for name, value in (resources.get(key) or {}).items() if not is_amd_key(name)}
        if kept:
            resources[key] = kept
        else:
            resources.pop(key, None)
    resources["claims"] = [*(resources.get("claims") or []), {"name": pod_claim}]
    changed[index] = {**changed[index], "resources": resources}
    return changed


def pool_shapes(pools: Iterable[str], node_pools: Mapping[str, str],
                gpus_of: Callable[[str], Sequence[GpuSpec]]) -> list[GpuSpec]:
    """The GPUs of the nodes labelled into `pools` (`gpus_of`: a node's GPU specs, as its AmdGpuNode says)."""
    wanted = set(pools)
    return [spec for node, pool in sorted(node_pools.items()) if pool in wanted for spec in gpus_of(node)]
