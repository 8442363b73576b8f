"""Each pool's fragmentation model, fed by the pod feed (rocshare.core.workload has the rules).

A pod is sampled once, the first time the feed shows it bound to a node of a pool: with an
allocation record, its shape is read from the record (GPUs of its app containers; per GPU the
share asked: 1000 for a whole GPU, else gpucores x 10 or, without cores, its CUs against the
GPU's); without one, a pod of rocshare's scheduler is a GPU-less task (the FGD measure counts
those: a CPU-only task can use no free GPU). Every shape carries the pod's CPU request
(holdings.host_request), as the simulator's typical workload does. A restarted operator relearns
from the pods the cluster holds. Pods of no pool, other schedulers' GPU-less pods (DaemonSets),
unreadable records and init containers are left out. A pod of DRA mode's profile is sampled the same
way: its shape from the request admission kept on it (rocshare.api.dra_request), or a GPU-less task.
`context(pool)` is what decisions score with: the pool's model (rebuilt only every few binds, see
WorkloadWindow) in a ScoringContext built once per model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from rocshare.api.allocation import AllocationError, AllocationRecord, decode_record
from rocshare.api.dra import DRA_SCHEDULER_NAME
from rocshare.api.models import GpuPolicy
from rocshare.core.fragmentation import MILLI, FragmentationModel
from rocshare.core.ids import PodKey
from rocshare.core.policies import NodeScorer, Policy, ScoringContext
from rocshare.core.request import PodRequest
from rocshare.core.workload import Shape, WorkloadWindow
from rocshare_operator.feed.cluster_facts import PodFacts

log = logging.getLogger(__name__)
SHARE_STEP = 10
"""Shares are rounded to 10 milli (1 % of a GPU), so near-equal asks group together."""


class PoolWorkloads:
    def __init__(self, pool_of_node: Mapping[str, str], cu_counts: Callable[[str], dict[str, int]],
                 scheduler_name: str = "rocshare-scheduler") -> None:
        self._pool_of_node = pool_of_node
        self._scheduler_name = scheduler_name
        self._cu_counts = cu_counts
        self.windows: dict[str, WorkloadWindow] = {}
        self._sampled: set[PodKey] = set()
        self._contexts: dict[int, tuple[FragmentationModel, ScoringContext]] = {}

    def on_pod(self, kind: str, pod: PodFacts) -> None:
        key = pod.key
        if kind == "DELETED":
            self._sampled.discard(key)
            return
        if key in self._sampled or not pod.node or pod.problem is not None:
            return
        if pod.allocation is None and pod.dra_request is None and (
                pod.hami is not None or pod.scheduler_name not in (self._scheduler_name, DRA_SCHEDULER_NAME)):
            return
        pool = self._pool_of_node.get(pod.node)
        if pool is None:
            return
        self._sampled.add(key)
        shape = self._shape(pod)
        if shape is not None:
            self.windows.setdefault(pool, WorkloadWindow()).add(shape)

    def context(self, pool: str | None) -> ScoringContext:
        """The pool's scoring context; a pool that has seen nothing scores with the prior."""
        window = self.windows.get(pool or "")
        if window is None:
            window = self.windows.setdefault(pool or "", WorkloadWindow())
        model = window.model()
        found = self._contexts.get(id(window))
        if found is None or found[0] is not model:
            found = self._contexts[id(window)] = (model, ScoringContext(fragmentation=model))
        return found[1]

    def _shape(self, pod: PodFacts) -> Shape | None:
        if pod.allocation is None and pod.dra_request is not None:
            return request_shape(pod.dra_request, cpu_milli=pod.host.cpu_milli)
        if pod.allocation is None:
            return (pod.host.cpu_milli, 0, 0, ())
        try:
            record = decode_record(pod.allocation)
        except AllocationError as error:
            log.debug("pod %s: no workload sample (%s)", pod.key, error)
            return None
        return shape_of(record, self._cu_counts(pod.node), cpu_milli=pod.host.cpu_milli)


def shape_of(record: AllocationRecord, cu_counts: Mapping[str, int], *, cpu_milli: int = 0) -> Shape | None:
    """(cpu_milli, GPUs, share milli per GPU, any product) of the record's app containers."""
    devices = [device for container in record.containers if not container.init or container.sidecar
               for device in container.devices]
    if not devices:
        return None
    shares = []
    for device in devices:
        if device.whole or device.reserves_all_cores:
            shares.append(MILLI)
        elif device.cores_pct:
            shares.append(device.cores_pct * 10)
        else:
            total = cu_counts.get(device.gpu_id) or 0
            shares.append(round(MILLI * device.cu_count / total) if total else MILLI)
    share = max(SHARE_STEP, min(MILLI, round(max(shares) / SHARE_STEP) * SHARE_STEP))
    return (cpu_milli, len(devices), share, ())


def request_shape(request: PodRequest, *, cpu_milli: int = 0) -> Shape | None:
    """`shape_of` for a DRA pod, from what it asked (its claim's devices are not its own record):
    per GPU, gpucores x 10, else the whole GPU."""
    asks = [(container.gpus, container.cores_pct) for container in request.containers
            if container.gpus and (not container.init or container.sidecar)]
    if not asks:
        return None
    share = max(MILLI if cores is None else cores * 10 for _, cores in asks)
    share = max(SHARE_STEP, min(MILLI, round(share / SHARE_STEP) * SHARE_STEP))
    return (cpu_milli, sum(gpus for gpus, _ in asks), share, ())


def reads_model(policy: Policy) -> bool:
    """Whether the policy's scores read a fragmentation model (others score alike without one)."""
    return policy.node in (NodeScorer.FGD, NodeScorer.FRAGMENTATION) or policy.gpu == GpuPolicy.FRAGMENTATION_AWARE
