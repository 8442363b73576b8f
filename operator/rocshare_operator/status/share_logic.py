"""An AmdGpuShare's ResourceQuota and status. Pure.

The quota is named ``rocshare-<share>`` in the share's namespace and lists only the
limits the share sets: ``limits.amd.com/gpumem`` (MiB), ``limits.amd.com/gpucores``
(percent of one GPU) and ``requests.amd.com/gpu``. The share owns it, so deleting
the share removes it.

Kubernetes counts an extended resource in a quota only under ``requests.`` (kube-apiserver's pod
evaluator), so it counts ``requests.amd.com/gpu`` itself and never the two ``limits.`` entries:
rocshare writes their ``status.used`` (`quota_used`), from the allocation records, so the quota
shows what rocshare's check counts, a resized pod's record included (a pod's spec is immutable).
The quota controller keeps entries it does not count, and its admission refuses nothing on them.

A share is its namespace's quota (docs/accounting.md: why it names no pool). Usage is what
the namespace's pods hold, by rocshare.core.holdings: the figures the extender's quota check
adds a pod's cost to. A pod whose hold cannot be read makes the namespace unaccountable: the
extender binds none of its pods while the share limits it, and Ready says so.
The pods list is bounded (a status must stay small; etcd caps objects near
1.5 MiB); ``podsTotal`` counts them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from rocshare.api.models import API_VERSION, AmdGpuShareStatus, ShareLimits, ShareUsage, SliceHolder
from rocshare.core.quantity import QuantityError, whole_quantity
from rocshare_operator.status.conditions import ConditionState, merge_conditions
from rocshare_operator.status.pool_status import Inventory
from rocshare_operator.status.usage import PodSlices

QUOTA_PREFIX = "rocshare-"
PODS_LISTED_MAX = 100
NAME_MAX_CHARS = 253
# Share names may be longer than a label value allows; the owner reference names the share.
QUOTA_LABELS = {"app.kubernetes.io/managed-by": "rocshare-operator", "app.kubernetes.io/component": "share-quota"}

GPUMEM_LIMIT = "limits.amd.com/gpumem"
GPUCORES_LIMIT = "limits.amd.com/gpucores"
GPU_REQUEST = "requests.amd.com/gpu"


def quota_name(share: str) -> str:
    """``rocshare-<share>``; a name too long for the prefix is cut and given a hash, to stay unique."""
    name = QUOTA_PREFIX + share
    if len(name) <= NAME_MAX_CHARS:
        return name
    digest = hashlib.sha256(share.encode()).hexdigest()[:10]
    return f"{name[:NAME_MAX_CHARS - 11]}-{digest}"


def quota_hard(limits: ShareLimits) -> dict[str, str]:
    hard = {}
    if limits.memory_mib is not None:
        hard[GPUMEM_LIMIT] = str(limits.memory_mib)
    if limits.cores_pct is not None:
        hard[GPUCORES_LIMIT] = str(limits.cores_pct)
    if limits.gpus is not None:
        hard[GPU_REQUEST] = str(limits.gpus)
    return hard


def quota_used(limits: ShareLimits, used: ShareUsage) -> dict[str, str]:
    """The quota's ``status.used`` entries rocshare counts: those of `quota_hard`'s ``limits.``
    entries (the record's MiB and percent, as share status). ``requests.amd.com/gpu`` is
    Kubernetes' own count and left to it."""
    mirrored = {}
    if limits.memory_mib is not None:
        mirrored[GPUMEM_LIMIT] = str(used.memory_mib)
    if limits.cores_pct is not None:
        mirrored[GPUCORES_LIMIT] = str(used.cores_pct)
    return mirrored


def quota_used_differs(seen: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether the quota's used entries (as the API server keeps them: 20000 is "20k") say other
    figures than `wanted`; an entry that cannot be read differs."""
    def value(raw: str, key: str) -> int | None:
        try:
            return whole_quantity(raw, name=key, unit="count")
        except QuantityError:
            return None
    return set(seen) != set(wanted) or any(value(seen[key], key) != int(wanted[key]) for key in wanted)


def quota_body(*, share: str, namespace: str, uid: str, limits: ShareLimits) -> dict:
    """The whole intent for the quota, for server-side apply."""
    owner = {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "name": share, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": quota_name(share), "namespace": namespace, "labels": dict(QUOTA_LABELS),
                     "ownerReferences": [owner]},
        "spec": {"hard": quota_hard(limits)},
    }


def share_usage(pods: Iterable[PodSlices], inventories: Mapping[str, Inventory]) -> ShareUsage:
    """What the namespace's readable pods hold (the extender's quota figures)."""
    memory = cores = gpus = 0
    for pod in pods:
        if pod.error:
            continue
        inventory = inventories.get(pod.node)
        held = pod.held(inventory.cu_counts() if inventory else {})
        memory += held.memory_mib
        cores += held.cores_pct
        gpus += held.gpus
    return ShareUsage(memory_mib=memory, cores_pct=cores, gpus=gpus)


def slice_holders(pods: Iterable[PodSlices]) -> list[SliceHolder]:
    """The first PODS_LISTED_MAX pods by name, with what each holds."""
    ordered = sorted(pods, key=lambda pod: pod.name)[:PODS_LISTED_MAX]
    return [SliceHolder(pod=pod.name, node=pod.node, gpu_ids=pod.gpu_ids,
                        memory_mib=pod.memory_mib, cu_count=pod.cu_count) for pod in ordered]


def share_status(*, share: str, generation: int | None, pods: Sequence[PodSlices],
                 inventories: Mapping[str, Inventory], previous_conditions: Iterable[Mapping] | None,
                 now: str) -> dict:
    """The status object to write (camelCase JSON, as AmdGpuShareStatus)."""
    status = AmdGpuShareStatus(
        used=share_usage(pods, inventories), pods=slice_holders(pods), pods_total=len(pods),
        quota_name=quota_name(share), observed_generation=generation,
    ).to_json_dict()
    status["conditions"] = merge_conditions(previous_conditions, [_ready(share, pods)],
                                            generation=generation, now=now)
    return status


def _ready(share: str, pods: Sequence[PodSlices]) -> ConditionState:
    unreadable = sorted(f"{pod.name} ({pod.error})" for pod in pods if pod.error)
    if unreadable:
        return ConditionState("Ready", "False", "UnaccountablePods",
                              f"{len(unreadable)} pod(s) hold what cannot be read, so the namespace's use is unknown;"
                              f" no new pod of it is bound until they end: {'; '.join(unreadable[:5])}")
    return ConditionState("Ready", "True", "QuotaApplied", f"ResourceQuota {quota_name(share)} applied")
