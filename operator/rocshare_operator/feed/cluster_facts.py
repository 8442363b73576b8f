"""The few facts the operator process reads of Nodes and Pods, decoded once per event. Pure.

The cluster feed (cluster_feed.py) keeps one of these per object instead of its body,
and hands the same value to every reader: the extender's `SchedulerState` and the pool
and share reconcilers. So they hold only what some reader uses:
* a Node: its `NodeView` (name, labels, the pool marks), allocatable devices (amd.com/gpu or partition
  names) and allocatable CPU and memory (the extender scores host resources as the simulator does);
  a Node that cannot be read is kept as its name and `problem` (it offers nothing; decoders here
  never raise, because an informer keeps an object's previous value when its decoder raises);
* a Pod: where it runs, its CPU and memory requests (rocshare.core.holdings.host_request), its phase and scheduler, whether the kubelet has started it
  (status.startTime), whether it waits as unschedulable or is being deleted, and its allocation record (text; read by readers through
  rocshare.core.holdings); a pod whose facts cannot be read is kept with its `problem`
  (and whatever of its name and node could be read): it holds unknown GPUs on its node;
  a pod HAMi placed (no rocshare record) carries HAMi's decision instead (`HamiPlacement`);
* a ResourceQuota: its limits and the AmdGpuShare that owns it (`QuotaFacts`);
* a ResourceClaim of rocshare's DRA driver: its allocated devices and node, the agent's record once
  prepared, its requests (`ClaimFacts`);
* an AmdGpuNode: its GPUs as `GpuFacts`, slotted copies of the validated `GpuInfo`
  models (a tenth of their size), or why its status was refused; pool and share status
  read `GpuSummary` of them (for a refused status, of what the agent wrote, as counted
  before validation).
Two facts compare equal exactly when no reader can tell the objects apart, which is
what lets the feed drop heartbeats and status ticks before any reader sees them.

Strings that repeat across objects (label keys and values, namespaces, node names,
the pool settings JSON every node of a pool carries) are interned, so thousands of
nodes share one copy.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from rocshare.api import dra
from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.dra_request import DRA_REQUEST_ANNOTATION, DraRequestError, request_of, with_limits
from rocshare.api.hami import HamiPlacement, hami_placement
from rocshare.api.models import AmdGpuNodeStatus, CuTopologyInfo, GpuInfo, Partition
from rocshare.api.resource_names import is_gpu_resource
from rocshare.api.resize import RESIZE_ANNOTATION
from rocshare.core.dra_shares import AllocatedDevice
from rocshare.core.holdings import NO_HOST_REQUEST, HostRequest, host_request, placement_request
from rocshare.core.ids import PodKey, pod_key
from rocshare.core.quantity import QuantityError, cpu_milli_quantity, memory_mib_quantity, whole_quantity
from rocshare.core.request import PodRequest, RequestError
from rocshare_operator.feed.node_view import NodeMarks, NodeView, marks_of

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_LABEL_PAIRS_MAX = 100_000  # bound on the pair interner: past it, it starts afresh


@dataclass(frozen=True, slots=True)
class NodeFacts:
    view: NodeView
    gpus_allocatable: str | None  # the quantity as written; None when the node lists none
    cpu_milli: int = 0  # allocatable CPU; 0 when not listed or unreadable (host resources then untracked)
    memory_mib: int = 0  # allocatable memory, whole MiB rounded down; 0 likewise
    problem: str | None = None  # the Node could not be read: it offers nothing (and no pool touches it)

    @property
    def name(self) -> str:
        return self.view.name


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    node: str  # spec.nodeName, "" while unbound
    scheduler_name: str
    phase: str
    deleting: bool
    unschedulable: str | None  # PodScheduled's message while its reason is Unschedulable, else None
    started: bool  # status.startTime is set: the kubelet admitted the pod (its devices were allocated)
    allocation: str | None  # the allocation record as written on the pod
    problem: str | None = None  # the pod could not be read: it holds unknown GPUs on `node`
    hami: HamiPlacement | None = None  # HAMi's decision, on a pod without rocshare's record (holdings.read_hami)
    host: HostRequest = NO_HOST_REQUEST  # its CPU and memory requests, kube-scheduler's rule
    uid: str = ""
    priority: int = 0  # spec.priority (the API server resolves the PriorityClass into it; absent: 0)
    preempt_never: bool = False  # spec.preemptionPolicy: Never
    nominated: str = ""  # status.nominatedNodeName: kube-scheduler's (or the extender's) nomination
    started_at: str = ""  # status.startTime, RFC 3339
    labels: tuple[tuple[str, str], ...] = ()  # for PodDisruptionBudget selectors (preemption)
    request: PodRequest | None = None  # what it asks, read only while it is nominated and unbound (the hold)
    resize: str | None = None  # the resize request as written on the pod (rocshare.api.resize), None: none
    claims: bool = False  # spec.resourceClaims names a claim (a DRA pod: its slice cannot be resized)
    dra_request: PodRequest | None = None  # a bound DRA pod's request (rocshare.io/dra-request), for the pool's model

    @property
    def key(self) -> PodKey:
        return pod_key(self.namespace, self.name)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """`GpuInfo`'s fields as plain values (peers as a tuple): what `NodeInventory.from_gpu_infos`
    and the binder read, without a pydantic model per GPU."""

    id: str
    index: int
    render_minor: int | None
    card: int | None
    product: str
    resource: str
    device_id: str
    gfx_target_version: int
    vram_mib: int | None
    cu_count: int
    cu_per_wgp: int
    pci_bdf: str
    numa: int | None
    hive_id: str | None
    xgmi_peers: tuple[str, ...]
    partition: Partition | None
    split_count: int
    healthy: bool
    health_reason: str | None
    cu_topology: CuTopologyInfo | None
    """One object per shape (thousands of alike GPUs share it)."""


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """What pool and share status need of one GPU."""

    id: str
    cu_count: int
    vram_mib: int | None
    healthy: bool


@dataclass(frozen=True, slots=True)
class GpuNodeFacts:
    name: str
    gpus: tuple[GpuFacts, ...] | None  # None: no status published yet, or a refused one
    problem: str | None = None  # why the status was refused
    unvalidated: tuple[GpuSummary, ...] = ()  # a refused status's GPUs, as written
    plugin_serving: bool = True  # the DevicePlugin condition (AmdGpuNodeStatus.device_plugin_serving)
    _summaries: tuple[GpuSummary, ...] | None = field(default=None, compare=False, repr=False)

    def summaries(self) -> tuple[GpuSummary, ...]:
        """Worked out once per facts (pool status reads every member's on each reconcile)."""
        if self.gpus is None:
            return self.unvalidated
        found = self._summaries
        if found is None:
            found = tuple(GpuSummary(gpu.id, gpu.cu_count, gpu.vram_mib, gpu.healthy) for gpu in self.gpus)
            object.__setattr__(self, "_summaries", found)  # frozen: a cache, not a change
        return found


def gpu_facts(info: GpuInfo) -> GpuFacts:
    values = {name: _interned(value) if isinstance(value, str) else value
              for name, value in ((name, getattr(info, name)) for name in GpuInfo.model_fields)}
    values["id"] = info.id  # unique per GPU: nothing to share
    values["xgmi_peers"] = tuple(sys.intern(peer) for peer in info.xgmi_peers)
    if info.cu_topology is not None:
        values["cu_topology"] = _TOPOLOGIES.setdefault(info.cu_topology, info.cu_topology)
    return GpuFacts(**values)


_TOPOLOGIES: dict[CuTopologyInfo, CuTopologyInfo] = {}
"""Interned GPU topologies: a handful of shapes in any fleet."""


def gpu_node_facts(obj: Mapping) -> GpuNodeFacts:
    """Validates the AmdGpuNode's status (AmdGpuNodeStatus); a status that fails is kept as its
    problem. Never raises: an AmdGpuNode that cannot be read offers nothing."""
    try:
        return _gpu_node_facts(obj)
    except Exception as error:  # noqa: BLE001 -- any failure here must fail closed, not keep old facts
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return GpuNodeFacts(sys.intern(name if isinstance(name, str) else ""), None,
                            problem=f"the AmdGpuNode cannot be read: {type(error).__name__}: {error}")


def _gpu_node_facts(obj: Mapping) -> GpuNodeFacts:
    name = sys.intern((obj.get("metadata") or {}).get("name", ""))
    if "status" not in obj:
        return GpuNodeFacts(name, None)
    try:
        status = AmdGpuNodeStatus.model_validate(obj["status"])
    except ValidationError as error:
        return GpuNodeFacts(name, None, problem=f"invalid status: {error.errors()[0]}",
                            unvalidated=gpu_summaries((obj.get("status") or {}).get("gpus") or []))
    return GpuNodeFacts(name, tuple(gpu_facts(info) for info in status.gpus),
                        plugin_serving=status.device_plugin_serving())


def gpu_summaries(gpus: Iterable[Mapping]) -> tuple[GpuSummary, ...]:
    """From AmdGpuNode status.gpus entries as written; missing or garbled numbers read as 0 / unknown."""
    if not isinstance(gpus, list):
        return ()
    return tuple(GpuSummary(id=sys.intern(str(gpu.get("id", ""))), cu_count=_number(gpu.get("cuCount")) or 0,
                            vram_mib=_number(gpu.get("vramMiB")), healthy=gpu.get("healthy") is True)
                 for gpu in gpus if isinstance(gpu, Mapping))


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def node_facts(node: Mapping) -> NodeFacts:
    """Never raises: a Node that cannot be read is kept as its name and the problem, so that it
    offers nothing (its previous facts would be silently stale)."""
    try:
        return _node_facts(node)
    except Exception as error:  # noqa: BLE001 -- any failure here must fail closed, not keep old facts
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return NodeFacts(view=NodeView(name=sys.intern(name if isinstance(name, str) else ""), labels=(),
                                       marks=NodeMarks()), gpus_allocatable=None,
                         problem=f"the Node cannot be read: {type(error).__name__}: {error}")


def _node_facts(node: Mapping) -> NodeFacts:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    marks = marks_of(labels, meta.get("annotations") or {}, _interned)
    view = NodeView(name=sys.intern(meta.get("name", "")),
                    labels=tuple(_label_pair(key, labels[key]) for key in sorted(labels)), marks=marks)
    listed = (node.get("status") or {}).get("allocatable") or {}
    cpu_milli, memory_mib = _host_allocatable(listed)
    return NodeFacts(view=view, gpus_allocatable=_interned(_gpus_allocatable(listed)), cpu_milli=cpu_milli,
                     memory_mib=memory_mib)


def _host_allocatable(allocatable: Mapping) -> tuple[int, int]:
    """(CPU milli, memory MiB rounded down) the node offers; 0 for one not listed or unreadable:
    the extender then leaves that resource to kube-scheduler, as before it tracked any."""
    try:
        cpu_milli = cpu_milli_quantity(allocatable["cpu"]) if "cpu" in allocatable else 0
    except QuantityError:
        cpu_milli = 0
    try:
        memory_mib = memory_mib_quantity(allocatable["memory"], round_up=False) if "memory" in allocatable else 0
    except QuantityError:
        memory_mib = 0
    return cpu_milli, memory_mib


def _gpus_allocatable(allocatable: Mapping) -> str | None:
    """The node's allocatable devices: amd.com/gpu, or the sum of its partition names (mixed
    naming). A quantity that cannot be read is kept as written, so the node offers nothing."""
    values = [str(value) for name, value in allocatable.items() if is_gpu_resource(str(name))]
    if len(values) <= 1:
        return values[0] if values else None
    try:
        return str(sum(whole_quantity(value, name="allocatable devices", unit="devices") for value in values))
    except QuantityError:
        return next(value for value in values if not _readable(value))


def _readable(value: str) -> bool:
    try:
        whole_quantity(value, name="allocatable devices", unit="devices")
        return True
    except QuantityError:
        return False


def pod_facts(pod: Mapping) -> PodFacts:
    """Never raises: a pod that cannot be read is kept as what could be read of it plus the
    problem, so that readers block what it may hold rather than lose it (DESIGN.md section 2)."""
    try:
        return _pod_facts(pod)
    except Exception as error:  # noqa: BLE001 -- any failure here must fail closed, not drop the pod
        return _unreadable_pod(pod, f"its object cannot be read: {type(error).__name__}: {error}")


def _pod_facts(pod: Mapping) -> PodFacts:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return PodFacts(
        namespace=sys.intern(meta.get("namespace", "")), name=meta.get("name", ""),
        node=sys.intern(spec.get("nodeName") or ""), scheduler_name=sys.intern(spec.get("schedulerName") or ""),
        phase=sys.intern(status.get("phase") or "Pending"), deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=_unschedulable(status), started=bool(status.get("startTime")),
        allocation=annotations.get(ALLOCATION_ANNOTATION),
        hami=None if ALLOCATION_ANNOTATION in annotations else hami_placement(annotations, spec),
        host=host_request(spec),
        uid=meta.get("uid") or "", priority=_priority(spec),
        preempt_never=spec.get("preemptionPolicy") == "Never",
        nominated=status.get("nominatedNodeName") or "", started_at=status.get("startTime") or "",
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        request=_nominated_request(pod, spec, status),
        resize=annotations.get(RESIZE_ANNOTATION), claims=bool(spec.get("resourceClaims")),
        dra_request=_dra_request(pod, annotations, spec),
    )


def _dra_request(pod: Mapping, annotations: Mapping, spec: Mapping) -> PodRequest | None:
    """What a bound pod whose amd.com/* limits admission turned into claims asked (rocshare.api.dra_request);
    None for other pods, or when it cannot be read (the pool's model then does not sample it)."""
    if DRA_REQUEST_ANNOTATION not in annotations or not spec.get("nodeName"):
        return None
    try:
        return placement_request(with_limits(pod, request_of(pod)))
    except (RequestError, DraRequestError):
        return None


def _priority(spec: Mapping) -> int:
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _nominated_request(pod: Mapping, spec: Mapping, status: Mapping) -> PodRequest | None:
    """The request of a pod that holds room it was nominated for (status.nominatedNodeName, not bound
    yet): the hold of preemption (extender/preemption.py). None for every other pod, or when it cannot
    be read (then it holds no room: the filter refuses it as well)."""
    if not status.get("nominatedNodeName") or spec.get("nodeName"):
        return None
    try:
        return placement_request(pod)
    except RequestError:
        return None


def _unreadable_pod(pod: object, problem: str) -> PodFacts:
    def text(*path: str) -> str:
        value: object = pod
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value if isinstance(value, str) else ""
    return PodFacts(namespace=text("metadata", "namespace"), name=text("metadata", "name"),
                    node=text("spec", "nodeName"), scheduler_name=text("spec", "schedulerName"),
                    phase="Pending", deleting=False, unschedulable=None, started=False, allocation=None,
                    problem=problem)


def _unschedulable(status: Mapping) -> str | None:
    """The message, not a flag: kube-scheduler rewrites it on each failed try, and that update
    must reach the extender (it notes the pod as waiting again, see retry.py)."""
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "")
    return None


def _interned(text: str | None) -> str | None:
    return None if text is None else sys.intern(text)


_label_pairs: dict[tuple[str, str], tuple[str, str]] = {}


def _label_pair(key: str, value: str) -> tuple[str, str]:
    """One shared (key, value) tuple per distinct label: most labels repeat on every node."""
    pair = (sys.intern(key), sys.intern(str(value)))
    found = _label_pairs.get(pair)
    if found is None:
        if len(_label_pairs) >= _LABEL_PAIRS_MAX:
            _label_pairs.clear()
        found = _label_pairs[pair] = pair
    return found


USED_BY_ROCSHARE = "limits.amd.com/"
"""The quota entries Kubernetes does not count (extended resources count only under ``requests.``)."""


@dataclass(frozen=True, slots=True)
class QuotaFacts:
    """What readers use of a ResourceQuota: its spec.hard, the AmdGpuShare that owns it, if any, and
    the ``limits.amd.com/*`` entries of status.used, which Kubernetes never counts and the share's
    loop writes (status.share_logic.quota_used); not the rest of status.used, which the quota
    controller rewrites on every pod the namespace starts."""

    namespace: str
    name: str
    hard: Mapping[str, str]
    share: str | None = None  # the AmdGpuShare that owns it (a quota a share wrote), else None
    used_limits: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def quota_facts(quota: Mapping) -> QuotaFacts:
    meta = quota.get("metadata") or {}
    owners = [ref.get("name") for ref in meta.get("ownerReferences") or () if ref.get("kind") == "AmdGpuShare"]
    hard = {str(key): str(value) for key, value in ((quota.get("spec") or {}).get("hard") or {}).items()}
    used = ((quota.get("status") or {}).get("used") or {}).items()
    return QuotaFacts(namespace=sys.intern(meta.get("namespace", "")), name=meta.get("name", ""), hard=hard,
                      share=owners[0] if owners else None,
                      used_limits={str(key): str(value) for key, value in used if str(key).startswith(USED_BY_ROCSHARE)})



@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """What readers use of a ResourceClaim that asks rocshare's DRA driver (docs/dra.md): the
    devices of the driver it was allocated, on which node, the record the node agent wrote once it
    prepared the claim, and its device requests (what it may take, for quota while unallocated).
    A claim that asks other drivers only is kept with `ours` False and nothing else."""

    namespace: str
    name: str
    ours: bool = False
    node: str = ""  # the node of its devices; "" while unallocated
    devices: tuple[AllocatedDevice, ...] = ()
    prepared: str | None = None  # the agent's allocation record (rocshare.io/allocation), once prepared
    requests_json: str = "[]"  # spec.devices.requests as JSON (compared cheaply; read only by quota)
    problem: str | None = None  # the claim could not be read: it may hold anything on `node`

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def allocated(self) -> bool:
        return bool(self.node)


def claim_facts(claim: Mapping) -> ClaimFacts:
    """Never raises (a claim that cannot be read keeps its name and the problem)."""
    meta = (claim.get("metadata") or {}) if isinstance(claim, Mapping) else {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    try:
        return _claim_facts(claim, namespace, name)
    except Exception as error:  # noqa: BLE001 -- fail closed: an unreadable claim is kept, not dropped
        return ClaimFacts(namespace=namespace, name=name, ours=True,
                          problem=f"its object cannot be read: {type(error).__name__}: {error}")


def _claim_facts(claim: Mapping, namespace: str, name: str) -> ClaimFacts:
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    asks = [request for request in requests if _asks_driver(request)]
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    ours = [result for result in results if result.get("driver") == dra.DRIVER_NAME]
    if not asks and not ours:
        return ClaimFacts(namespace=sys.intern(namespace), name=name)
    nodes = sorted({str(result.get("pool", "")) for result in ours})
    if len(nodes) > 1:
        raise ValueError(f"its devices of {dra.DRIVER_NAME} are on several nodes: {', '.join(nodes)}")
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return ClaimFacts(namespace=sys.intern(namespace), name=name, ours=True, node=sys.intern(nodes[0]) if nodes else "",
                      devices=tuple(AllocatedDevice.from_result(result) for result in ours),
                      prepared=annotations.get(ALLOCATION_ANNOTATION) if ours else None,
                      requests_json=json.dumps(asks, sort_keys=True))


def _asks_driver(request: Mapping) -> bool:
    """A request (or one of its subrequests) of rocshare's DeviceClass or one of its shape classes."""
    choices = [request.get("exactly") or {}, *(request.get("firstAvailable") or ())]
    return any(dra.is_rocshare_class(choice.get("deviceClassName")) for choice in choices)
