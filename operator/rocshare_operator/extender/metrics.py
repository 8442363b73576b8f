"""Scheduler metrics (port 31993): HAMi's names where HAMi has the figure, plus what it
lacks — latency histograms of filter, prioritize and bind, and decisions by outcome
and reason. Allocation gauges are computed from the ledger at scrape time, so they
cannot disagree with it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare_operator.extender.state import SchedulerState

MIB = 1024 * 1024
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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
        self.registry.register(_LedgerCollector(state))


class _LedgerCollector(Collector):
    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state
        memory = GaugeMetricFamily("hami_gpu_memory_allocated_bytes", "VRAM allocated on a GPU.",
                                   labels=["nodeid", "deviceuuid", "deviceidx"])
        cores = GaugeMetricFamily("hami_gpu_core_allocated_ratio", "Share of a GPU's CUs allocated (0-1).",
                                  labels=["nodeid", "deviceuuid", "deviceidx"])
        shared = GaugeMetricFamily("hami_gpu_shared_num", "Pods holding a slice of a GPU.",
                                   labels=["nodeid", "deviceuuid", "deviceidx"])
        for node_name, node in state.inventories.items():
            usage = state.ledger.usage(node)
            for spec, gpu in zip(node.gpus, usage.gpus):
                labels = [node_name, spec.gpu_id, str(spec.index)]
                memory.add_metric(labels, gpu.memory_mib * MIB)
                cores.add_metric(labels, gpu.cu_held / spec.cu_count if spec.cu_count else 0.0)
                shared.add_metric(labels, gpu.slices)
        pods = GaugeMetricFamily("hami_vgpu_memory_allocated_bytes", "VRAM allocated to a pod on a GPU.",
                                 labels=["podnamespace", "podname", "nodename", "deviceuuid"])
        for key, record in state.ledger.records().items():
            namespace, _, name = key.partition("/")
            for container in record.containers:
                for device in container.devices:
                    pods.add_metric([namespace, name, record.node, device.gpu_id], device.memory_mib * MIB)
        quota = GaugeMetricFamily("hami_resource_quota_used", "amd.com quota held per namespace.",
                                  labels=["quotanamespace", "resource"])
        for namespace, cost in state.namespace_costs.items():
            quota.add_metric([namespace, "limits.amd.com/gpumem"], cost.memory_mib)
            quota.add_metric([namespace, "limits.amd.com/gpucores"], cost.cores_pct)
            quota.add_metric([namespace, "requests.amd.com/gpu"], cost.gpus)
        yield from (memory, cores, shared, pods, quota)
