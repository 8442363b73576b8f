"""Scheduler metrics (port 31993), in the names, labels and units of HAMi's scheduler
(cmd/scheduler/metrics.go, HAMi v2.10, after its March 2026 label rename), plus rocshare's
own series under `rocshare_*`: latency histograms of filter, prioritize and bind, and
decisions by outcome and reason. docs/metrics.md is the contract; tests/unit/operator/
test_metrics_contract.py holds the code to it.

Allocation gauges are computed from the ledger and the allocation records at scrape time,
so they cannot disagree with what the extender decides. Units follow HAMi: bytes for memory,
percent (0-100) for core limits and allocations, except `hami_node_gpu_memory_allocated_ratio`,
which HAMi emits as a 0-1 fraction. Every hami_* series carries HAMi's constant label
zone="vGPU".
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.core.cumask import full_mask, mask_from_ranges
from rocshare.core.fit import Reason
from rocshare.core.holdings import slice_cores_pct
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.share_rules import cores_percent
from rocshare_operator.extender.decisions import BLOCKED, NO_INVENTORY, UNREADABLE
from rocshare_operator.extender.state import SchedulerState

MIB = 1024 * 1024
ZONE = "vGPU"
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

GPU_LABELS = ["node", "device_uuid", "device_index", "device_type", "zone"]
ALLOCATED_LABELS = ["node", "device_uuid", "device_index", "device_cores", "device_type", "zone"]
OVERVIEW_LABELS = ["node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type", "zone"]
CONTAINER_LABELS = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
QUOTA_USED_LABELS = ["namespace", "quota_name", "limit", "zone"]
QUOTA_LIMIT_LABELS = ["namespace", "quota_name", "zone"]
UNIT_LABELS = ["node", "device_uuid", "device_index", "unit", "unit_index"]
UNIT_POD_LABELS = ["node", "device_uuid", "unit", "unit_index", "namespace", "pod"]

VERB_OUTCOMES = {"filter": ("fit", "unfit", "error"), "prioritize": ("scored",), "prioritize-dra": ("scored", "error"), "bind": ("bound", "refused"),
                 "preempt": ("answered",)}

# ResourceQuota names, as HAMi's quota_name label writes them (the key without "limits.").
QUOTA_MEMORY = "amd.com/gpumem"
QUOTA_CORES = "amd.com/gpucores"
QUOTA_GPUS = "amd.com/gpu"


PREEMPTION_OUTCOMES = ("evicted", "proposed", "not_helpful", "quota", "policy_never")
VICTIM_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


class ExtenderMetrics:
    def __init__(self, state: SchedulerState, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram("rocshare_extender_request_duration_seconds",
                                 "Time to answer one extender request, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.decisions = Counter("rocshare_extender_decisions_total",
                                 "Extender outcomes by verb and outcome (fit, unfit, bound, refused, error).",
                                 ["verb", "outcome"], registry=self.registry)
        self.node_rejections = Counter("rocshare_extender_node_rejections_total",
                                       "Nodes filtered out, by reason.", ["reason"], registry=self.registry)
        self.preemptions = Counter(
            "rocshare_preemptions", "Preemption decisions, by outcome: evicted (the extender evicted victims "
            "for a pod), proposed (kube-scheduler's preempt verb got victims), not_helpful (no set of "
            "lower-priority pods makes room), quota (the pod is over its namespace's quota), policy_never "
            "(preemptionPolicy: Never).", ["reason"], registry=self.registry)
        self.victims = Histogram("rocshare_preemption_victims", "Pods evicted per preemption the extender made.",
                                 buckets=VICTIM_BUCKETS, registry=self.registry)
        self.preemption_latency = Histogram("rocshare_preemption_decision_seconds",
                                            "Time to choose the victims of one preemption (every node asked about).",
                                            buckets=LATENCY_BUCKETS_S, registry=self.registry)
        for reason in PREEMPTION_OUTCOMES:
            self.preemptions.labels(reason)
        # Every verb's and reason's series exist from the first scrape (at 0), so rate() sees the
        # first requests (a counter born at 1 shows no increase).
        for verb, outcomes in VERB_OUTCOMES.items():
            self.latency.labels(verb)
            for outcome in outcomes:
                self.decisions.labels(verb, outcome)
        for reason in [*(reason.value for reason in Reason), NO_INVENTORY, UNREADABLE, BLOCKED]:
            self.node_rejections.labels(reason)
        self.registry.register(_LedgerCollector(state))


def device_type(spec: GpuSpec) -> str:
    """HAMi's device_type: the product name (rocshare's names start with "AMD", which is also
    what HAMi's own AMD normalisation keys on)."""
    return spec.product or "AMD"


def core_percent(cu_count: int, total: int) -> float:
    """HAMi's AMD normalisation: ceil(allocated CUs / CUs x 100)."""
    return float(cores_percent(cu_count, total)) if total > 0 else 0.0


class _LedgerCollector(Collector):
    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._gpu_families()
        yield from self._container_families()
        yield from self._quota_families()
        yield from self._isolation_families()

    def _metered(self) -> dict[str, NodeInventory]:
        """Nodes whose GPUs are reported: the extender's, and those of pools serving DRA."""
        return {**self._state.index.dra_inventories(), **self._state.inventories}

    def _gpu_families(self) -> Iterator[GaugeMetricFamily]:
        memory_limit = GaugeMetricFamily("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU",
                                         labels=GPU_LABELS)
        core_limit = GaugeMetricFamily("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU (percent)",
                                       labels=GPU_LABELS)
        memory = GaugeMetricFamily("hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU",
                                   labels=ALLOCATED_LABELS)
        shared = GaugeMetricFamily("hami_gpu_shared_count", "Number of containers sharing this GPU", labels=GPU_LABELS)
        cores = GaugeMetricFamily("hami_gpu_core_allocated_ratio",
                                  "Device core allocated for a certain GPU (percent of its CUs)", labels=GPU_LABELS)
        overview = GaugeMetricFamily("hami_node_gpu_overview", "GPU overview on a certain node (memory allocated, bytes)",
                                     labels=OVERVIEW_LABELS)
        memory_ratio = GaugeMetricFamily("hami_node_gpu_memory_allocated_ratio",
                                         "GPU memory allocated on a certain GPU (fraction 0-1, as HAMi emits it)",
                                         labels=GPU_LABELS)
        for node_name, node in self._metered().items():
            usage = self._state.ledger.usage(node)
            for spec, gpu in zip(node.gpus, usage.gpus):
                kind = device_type(spec)
                labels = [node_name, spec.gpu_id, str(spec.index), kind, ZONE]
                cores_labels = [node_name, spec.gpu_id, str(spec.index), str(spec.cu_count), kind, ZONE]
                allocated_bytes = gpu.memory_mib * MIB
                memory_limit.add_metric(labels, spec.memory_mib * MIB)
                core_limit.add_metric(labels, 100.0)
                memory.add_metric(cores_labels, allocated_bytes)
                shared.add_metric(labels, gpu.slices)
                cores.add_metric(labels, core_percent(gpu.cu_held, spec.cu_count))
                overview.add_metric(cores_labels[:4] + [str(spec.memory_mib), kind, ZONE], allocated_bytes)
                if spec.memory_mib > 0:
                    memory_ratio.add_metric(labels, gpu.memory_mib / spec.memory_mib)
        yield from (memory_limit, core_limit, memory, shared, cores, overview, memory_ratio)

    def _container_families(self) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container",
                                   labels=CONTAINER_LABELS)
        cores = GaugeMetricFamily("hami_vgpu_core_allocated_ratio",
                                  "vGPU core allocated from a container (percent of the GPU's CUs)", labels=CONTAINER_LABELS)
        cu_totals = {(name, spec.gpu_id): spec.cu_count for name, node in self._metered().items() for spec in node.gpus}
        for key, record in self._state.ledger.records().items():
            namespace, _, name = key.partition("/")
            # container_index: the container's place in the record (init containers first), so two
            # containers of one pod on one GPU are two series.
            for index, container in enumerate(record.containers):
                for device in container.devices:
                    labels = [namespace, record.node, name, str(index), device.gpu_id, ZONE]
                    memory.add_metric(labels, device.memory_mib * MIB)
                    held_pct = slice_cores_pct(device)  # what the container holds, as quota counts it
                    if held_pct is None:  # a record older than coresPct: from its CU ranges
                        held_pct = core_percent(device.cu_count, cu_totals.get((record.node, device.gpu_id), 0))
                    cores.add_metric(labels, float(held_pct))
        yield from (memory, cores)

    def _quota_families(self) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily("hami_resource_quota_used", "resourcequota usage for a certain device",
                                 labels=QUOTA_USED_LABELS)
        limit = GaugeMetricFamily("hami_resource_quota_limit", "resourcequota limit for a certain device",
                                  labels=QUOTA_LIMIT_LABELS)
        state = self._state
        for namespace in sorted(set(state.namespace_costs) | {ns for ns, quotas in state.quotas.items() if quotas}):
            cost = state.namespace_costs.get(namespace)
            limits = state.quota_limits(namespace)
            for quota_name, held, hard in ((QUOTA_MEMORY, cost.memory_mib if cost else 0, limits.memory_mib),
                                           (QUOTA_CORES, cost.cores_pct if cost else 0, limits.cores_pct),
                                           (QUOTA_GPUS, cost.gpus if cost else 0, limits.gpus)):
                used.add_metric([namespace, quota_name, str(hard or 0), ZONE], held)
                if hard is not None:
                    limit.add_metric([namespace, quota_name, ZONE], hard)
        yield from (used, limit)

    def _isolation_families(self) -> Iterator[GaugeMetricFamily]:
        """Per XCD (a GPU with several) or shader engine, which pods' CUs are on it (issue 41), by
        the kernel's mapping of mask bits (rocshare.core.cu_topology). A device held without CU
        ranges (whole, or every CU) is on every unit. GPUs whose agent reports no topology are left out."""
        tenants = GaugeMetricFamily("rocshare_gpu_unit_tenants",
                                    "Pods with CUs on this XCD (unit XCD) or shader engine (unit SE) of the GPU",
                                    labels=UNIT_LABELS)
        held = GaugeMetricFamily("rocshare_gpu_unit_cus_held",
                                 "CUs a pod holds on this XCD or shader engine of the GPU", labels=UNIT_POD_LABELS)
        specs = {(name, spec.gpu_id): spec for name, node in self._metered().items() for spec in node.gpus
                 if spec.topology is not None}
        masks: dict[tuple[str, str], dict[str, int]] = {}
        for key, record in self._state.ledger.records().items():
            for container in record.containers:
                for device in container.devices:
                    spec = specs.get((record.node, device.gpu_id))
                    if spec is None:
                        continue
                    mask = mask_from_ranges(device.cu_ranges) if device.cu_ranges else full_mask(spec.cu_count)
                    pods = masks.setdefault((record.node, device.gpu_id), {})
                    pods[key] = pods.get(key, 0) | mask
        for (node_name, gpu_id), spec in specs.items():
            unit, units = spec.topology.tenants_by_unit(masks.get((node_name, gpu_id), {}))
            for index, on_unit in enumerate(units):
                tenants.add_metric([node_name, gpu_id, str(spec.index), unit, str(index)], len(on_unit))
                for key, cus in sorted(on_unit.items()):
                    namespace, _, name = key.partition("/")
                    held.add_metric([node_name, gpu_id, unit, str(index), namespace, name], cus)
        yield from (tenants, held)

