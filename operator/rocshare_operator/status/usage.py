"""What pods hold, as pool and share status read it: rocshare.core.holdings applied to the
pods of the cluster feed, indexed by node and by namespace. Pure.

Units: VRAM in MiB, compute in percent of one GPU (so 250 is two and a half GPUs). The rule
for what a pod holds is the core's (`rocshare.core.holdings`), the same the extender's
ledger and quota apply. Pods that finished (Succeeded, Failed) hold nothing; a pod being
deleted still does until it is gone. A record that cannot be read is kept, with its problem,
and never read as free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rocshare.core.holdings import Held, Holding, read_hami, text_holding
from rocshare_operator.feed.cluster_facts import (
    GpuSummary,
    PodFacts,
    gpu_summaries,
    pod_facts,
)

__all__ = ["GpuSummary", "gpu_summaries"]  # re-exported: status code reads them with pods' use


@dataclass(frozen=True, slots=True)
class PodSlices:
    """One pod's hold, with the pod's name."""

    namespace: str
    name: str
    holding: Holding

    @property
    def node(self) -> str:
        return self.holding.node

    @property
    def error(self) -> str | None:
        return self.holding.problem

    @property
    def memory_mib(self) -> int:
        return self.holding.memory_mib

    @property
    def cu_count(self) -> int:
        return self.holding.cu_count

    @property
    def gpu_ids(self) -> list[str]:
        return [gpu.gpu_id for gpu in self.holding.gpus]

    def held(self, gpu_cu_counts: Mapping[str, int] | None = None) -> Held:
        return self.holding.held(gpu_cu_counts)


def pod_slices(pod: Mapping) -> PodSlices | None:
    """The hold of a pod object, or None when it holds nothing (no record, or finished)."""
    return slices_of(pod_facts(pod))


def slices_of(pod: PodFacts) -> PodSlices | None:
    """The pod's hold, or None when it holds nothing (no record, or finished). A bound pod whose
    facts could not be read holds unknown GPUs on its node (whatever its phase seemed to be)."""
    if pod.problem is not None:
        # Unbound (no node could be read), it holds nothing; bound, it may hold anything there.
        return PodSlices(pod.namespace, pod.name, Holding(pod.node, problem=pod.problem)) if pod.node else None
    if (pod.allocation is None and pod.hami is None) or pod.finished:
        return None
    if pod.allocation is None:
        return PodSlices(pod.namespace, pod.name, read_hami(pod.hami, pod.node)[1])  # a pod HAMi placed
    return PodSlices(pod.namespace, pod.name, text_holding(pod.allocation, pod.node))


class SliceIndex:
    """The holds of live pods, by node and by namespace: what pool and share status sum.

    Mutable, owned by its caller, rebuilt from the pod watch; only pods that hold something
    are kept (a pod without a record costs nothing here).
    """

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, PodSlices]] = {}
        self._by_node: dict[str, set[PodSlices]] = {}

    def put(self, namespace: str, name: str, held: PodSlices | None) -> PodSlices | None:
        """Record what the pod holds now (None: nothing); returns what it held before."""
        in_namespace = self._by_namespace.get(namespace, {})
        before = in_namespace.pop(name, None)
        if before is not None:
            on_node = self._by_node[before.node]
            on_node.discard(before)
            if not on_node:
                del self._by_node[before.node]
            if not in_namespace:
                del self._by_namespace[namespace]
        if held is not None:
            self._by_namespace.setdefault(namespace, {})[held.name] = held
            self._by_node.setdefault(held.node, set()).add(held)
        return before

    def on_node(self, node: str) -> list[PodSlices]:
        return list(self._by_node.get(node, ()))

    def in_namespace(self, namespace: str) -> list[PodSlices]:
        return list(self._by_namespace.get(namespace, {}).values())
