"""Invariants checked from what containers received, never from rocshare's own records.

The kubelet peer reports, with the status that moves a pod to Running, what each container would
be handed by the runtime: its device nodes and environment (simnode.runtime_specs) -- for a DRA
container, the edits of its claims' CDI specs as the runtime applies them, so both kinds read the
same. From that
alone -- `ROCR_VISIBLE_DEVICES`, the `/dev/dri/renderD<N>` nodes, `HSA_CU_MASK`,
`HIP_DEVICE_MEMORY_LIMIT_<i>` -- this module works out which GPU each container got and what
part of it, and checks, at every moment of a run, for every GPU:

* a container without a memory limit on it (a whole GPU) shares it with nobody;
* the CU ranges of its holders are disjoint; a holder without a CU mask on it holds every CU;
* the memory limits of its holders sum to no more than its VRAM (times the pool's scaling).

"Every moment" means every pod that ran, not those a poll happened to catch Running: a watch sees
each pod's every version in the API server's order, and a pod holds from the version that shows
it admitted until it is deleted or reaches Succeeded/Failed (when rocshare's ledger frees it too).
A pod that failed before the kubelet admitted it was never handed a device and never counts; one
that failed after admission stops counting at that version (`failed` lists both kinds).

Capacities and the render-minor -> GPU map come from the AmdGpuNode inventories (the agents'
reading of sysfs); nothing here reads an allocation record. Shared by the chaos and failover e2e
tests and `rocshare-dev bench failover`. `PodEvidence.run` raises on anything
unexpected (a malformed environment is a violation, not a skipped pod), so a caller that gathers
it sees the failure.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, object_path
from rocshare.kube.informer import Informer
from rocshare_dev.devcluster.simnode import runtime_specs

UUID = re.compile(r"^GPU-[0-9a-fA-F]{16}$")
RENDER = re.compile(r"renderD(\d+)$")
GPU_ENVS = frozenset({"HSA_CU_MASK", "HIP_VISIBLE_DEVICES"})
MEMORY_LIMIT_PREFIX = "HIP_DEVICE_MEMORY_LIMIT_"
"""A container with any of these, or a render node, was handed a GPU: it must say which."""


@dataclass(frozen=True)
class Gpu:
    node: str
    gpu_id: str
    index: int
    render_minor: int | None
    vram_mib: int
    cu_count: int


@dataclass(frozen=True)
class Share:
    """What one container received on one GPU."""

    pod: str
    container: str
    gpu: Gpu
    memory_mib: int | None  # None: no limit, a whole GPU
    cu_ranges: tuple[tuple[int, int], ...] | None  # None: no mask, every CU


def inventories(gpu_nodes: Iterable[dict[str, Any]]) -> dict[str, list[Gpu]]:
    """node -> its GPUs, from the AmdGpuNode objects (VRAM times the pool's deviceMemoryScaling)."""
    found: dict[str, list[Gpu]] = {}
    for obj in gpu_nodes:
        status = obj.get("status") or {}
        scaling = float(status.get("deviceMemoryScaling", 1.0))
        found[obj["metadata"]["name"]] = [
            Gpu(obj["metadata"]["name"], gpu["id"], gpu.get("index", 0), gpu.get("renderMinor"),
                int((gpu.get("vramMiB") or 0) * scaling), gpu["cuCount"]) for gpu in status.get("gpus", [])]
    return found


def parse_cu_mask(text: str) -> dict[int, tuple[tuple[int, int], ...]]:
    """`0:0-75;1:3-5,9` -> {0: ((0, 75),), 1: ((3, 5), (9, 9))} (DESIGN.md section 3)."""
    masks = {}
    for part in filter(None, text.split(";")):
        index, _, ranges = part.partition(":")
        spans = []
        for span in ranges.split(","):
            low, _, high = span.partition("-")
            spans.append((int(low), int(high or low)))
        masks[int(index)] = tuple(spans)
    return masks


def shares_of(pod: str, node: str, containers: dict[str, Any], gpus: list[Gpu]) -> list[Share]:
    """Every GPU share the containers of `pod` received, from their environment and devices."""
    by_id = {gpu.gpu_id: gpu for gpu in gpus}
    by_minor = {gpu.render_minor: gpu for gpu in gpus}
    shares = []
    for name, received in sorted(containers.items()):
        envs = received.get("envs") or {}
        visible = [entry for entry in (envs.get("ROCR_VISIBLE_DEVICES") or "").split(",") if entry]
        minors = [int(match.group(1)) for device in received.get("devices") or []
                  if (match := RENDER.search(device.get("containerPath", "")))]
        if not visible:
            gpu_envs = sorted(key for key in envs if key in GPU_ENVS or key.startswith(MEMORY_LIMIT_PREFIX))
            if minors or gpu_envs:  # handed a GPU (or told of one) but not which: unreadable, never skipped
                raise AssertionError(f"{pod}:{name}: render nodes {minors} and {gpu_envs} "
                                     "but no ROCR_VISIBLE_DEVICES: cannot tell which GPU it got")
            continue  # no GPU at all (a sidecar)
        unknown = [minor for minor in minors if minor not in by_minor]
        if unknown:
            raise AssertionError(f"{pod}:{name}: render minors {unknown} are not GPUs of {node}")
        handed = sorted((by_minor[minor] for minor in minors), key=lambda gpu: gpu.index)
        if len(handed) != len(visible):
            raise AssertionError(f"{pod}:{name}: {len(handed)} render nodes for ROCR_VISIBLE_DEVICES={visible}")
        masks = parse_cu_mask(envs.get("HSA_CU_MASK", ""))
        for i, entry in enumerate(visible):
            gpu = by_id.get(entry) if UUID.match(entry) else handed[int(entry)]
            if gpu is None or gpu not in handed:
                raise AssertionError(f"{pod}:{name}: ROCR_VISIBLE_DEVICES names {entry}, not a device it was handed")
            limit = envs.get(f"HIP_DEVICE_MEMORY_LIMIT_{i}")
            shares.append(Share(pod, name, gpu, int(limit.rstrip("m")) if limit else None, masks.get(i)))
    return shares


def conflicts(share: Share, others: Iterable[Share]) -> list[str]:
    """Why `share` cannot sit beside `others` on its GPU (empty: it can); memory counts `share` once."""
    gpu, problems = share.gpu, []
    here = [other for other in others
            if other.gpu == gpu and (other.pod, other.container) != (share.pod, share.container)]
    where = f"{gpu.node}/{gpu.gpu_id}"
    for other in here:
        if share.memory_mib is None or other.memory_mib is None:
            problems.append(f"{where}: {share.pod} and {other.pod} share a GPU one of them got whole")
        elif _overlap(share.cu_ranges, other.cu_ranges, gpu.cu_count):
            problems.append(f"{where}: CU ranges of {share.pod}:{share.container} {share.cu_ranges} and "
                            f"{other.pod}:{other.container} {other.cu_ranges} overlap")
    limited = [s.memory_mib for s in [share, *here] if s.memory_mib is not None]
    if gpu.vram_mib and sum(limited) > gpu.vram_mib:
        problems.append(f"{where}: memory limits {sum(limited)} MiB > {gpu.vram_mib} MiB")
    return problems


def _overlap(first: tuple[tuple[int, int], ...] | None, second: tuple[tuple[int, int], ...] | None,
             cu_count: int) -> bool:
    every = ((0, cu_count - 1),)
    return any(a <= d and c <= b for a, b in first or every for c, d in second or every)


@dataclass
class PodEvidence:
    """Watches the pods matching `label_selector` and checks every admitted pod against the pods
    holding GPUs at that moment; `violations`, `admitted` and `failed` are the outcome."""

    kube: Kube
    label_selector: str
    nodes: dict[str, list[Gpu]] = field(default_factory=dict)
    live: dict[str, list[Share]] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set)
    failed: dict[str, bool] = field(default_factory=dict)
    """pod -> whether it had been admitted (handed devices) before it failed."""
    violations: list[str] = field(default_factory=list)
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        self.nodes = inventories((await self.kube.list(object_path(API_VERSION, "amdgpunodes")))["items"])
        informer = Informer(self.kube, object_path("v1", "pods"), self._on_pod, name="evidence",
                            label_selector=self.label_selector, decode=lambda obj: obj)
        watching = asyncio.create_task(informer.run())
        try:
            await informer.synced.wait()
            self.synced.set()
            await watching
        finally:
            watching.cancel()

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        # The informer would retry a handler that raises and keep going: record it as a failure instead.
        try:
            self._take(kind, pod)
        except Exception as error:  # noqa: BLE001 - every error of the checker fails the test
            self.violations.append(f"the checker failed on {kind} {pod['metadata'].get('name')}: {error!r}")

    def _take(self, kind: str, pod: dict[str, Any]) -> None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            self.live.pop(key, None)
            if phase == "Failed" and key not in self.failed:
                self.failed[key] = key in self.admitted
            return
        received = runtime_specs(pod)
        if received is None or key in self.admitted:
            return
        self.admitted.add(key)
        node = pod["spec"].get("nodeName", "")
        try:
            shares = shares_of(key, node, received, self.nodes.get(node, []))
        except (AssertionError, ValueError, IndexError, KeyError) as error:
            self.violations.append(f"{key}: cannot read what it received: {error!r}")
            return
        holders = [share for held in self.live.values() for share in held]
        for share in shares:
            self.violations.extend(conflicts(share, holders))
            holders.append(share)  # a pod's containers must not overlap each other either
        self.live[key] = shares


async def stop_tasks(tasks: list[asyncio.Task]) -> None:
    """Cancel checking and driving tasks, then raise the first exception any of them had ended with:
    a task that died early must fail the run, not vanish in gather(return_exceptions=True)."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [result for result in results if isinstance(result, Exception)]
    if failures:
        raise failures[0]
