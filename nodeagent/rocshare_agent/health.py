"""GPU health: device files under a dev root, and the AMD Device Metrics Exporter.

Health is recomputed from scratch on every check, so a GPU that recovers becomes healthy
again (NVIDIA's plugin never does). Two sources, combined with "any says unhealthy wins":

* Device files: `/dev/kfd` and the GPU's `/dev/dri/renderD<M>` must open. A missing node,
  a dangling symlink or EACCES marks the GPU unhealthy with the OS error as the reason.
* The exporter (HTTP `/metrics`): gauge `gpu_health` (or any name ending in `_gpu_health`,
  e.g. `amd_gpu_health`), 1 healthy / 0 not, label `gpu_id` = the physical GPU's index
  (amd-smi order), optional `gpu_partition_id` for one partition of it.

A slow, dead or garbage-speaking exporter never breaks the agent: each poll is bounded by
a timeout, the failure is reported in `ExporterReading.error`, and the *last-known*
verdicts are kept for `stale_after_s` (default 60 s). After that they are dropped and
health falls back to device files alone: a dead exporter must not keep GPUs unhealthy, nor
hide a GPU it last saw failing for the first minute.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rocshare.api.models import GpuInfo

HEALTH_METRIC = "gpu_health"
DEFAULT_EXPORTER_TIMEOUT_S = 1.0
DEFAULT_STALE_AFTER_S = 60.0


# ---- device files ---------------------------------------------------------------------------


def device_file_problem(path: Path) -> str | None:
    """None when the device node opens; else why it does not."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return f"{path} cannot be opened: {error.strerror or error}"
    os.close(descriptor)
    return None


def apply_device_file_health(gpus: Sequence[GpuInfo], dev_root: Path) -> list[GpuInfo]:
    """The first health source: earlier verdicts on `gpus` are replaced, not kept."""
    kfd_problem = device_file_problem(dev_root / "kfd")
    return [_with_health(_healthy(gpu), kfd_problem or _render_problem(gpu, dev_root)) for gpu in gpus]


def _healthy(gpu: GpuInfo) -> GpuInfo:
    return gpu if gpu.healthy else gpu.model_copy(update={"healthy": True, "health_reason": None})


def _render_problem(gpu: GpuInfo, dev_root: Path) -> str | None:
    if gpu.render_minor is None:
        return "no render node: KFD reports no drm_render_minor"
    return device_file_problem(dev_root / "dri" / f"renderD{gpu.render_minor}")


def _with_health(gpu: GpuInfo, problem: str | None) -> GpuInfo:
    if problem is None:
        return gpu if gpu.healthy else gpu.model_copy(update={"healthy": True, "health_reason": None})
    if not gpu.healthy:  # the first reason found stays: device files before the exporter
        return gpu
    return gpu.model_copy(update={"healthy": False, "health_reason": problem})


# ---- exporter text ----------------------------------------------------------------------------


class ExporterError(ValueError):
    """The exporter's reply is not usable; says why."""


@dataclass(frozen=True)
class ExporterVerdict:
    gpu_id: str
    partition_id: str | None
    healthy: bool


def parse_exporter_health(text: str) -> list[ExporterVerdict]:
    """The `gpu_health` samples of a Prometheus text exposition; raises ExporterError."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as error:  # the parser raises ValueError, IndexError, ... on garbage
        raise ExporterError(f"not Prometheus text: {type(error).__name__}: {error}") from None
    verdicts = [
        ExporterVerdict(sample.labels["gpu_id"], sample.labels.get("gpu_partition_id") or None, sample.value >= 1)
        for family in families if _is_health_metric(family.name)
        for sample in family.samples if "gpu_id" in sample.labels
    ]
    if not verdicts:
        raise ExporterError(f"no {HEALTH_METRIC} samples with a gpu_id label")
    return verdicts


def _is_health_metric(name: str) -> bool:
    return name == HEALTH_METRIC or name.endswith("_" + HEALTH_METRIC)


def apply_exporter_health(gpus: Sequence[GpuInfo], verdicts: Sequence[ExporterVerdict]) -> list[GpuInfo]:
    unhealthy = [verdict for verdict in verdicts if not verdict.healthy]
    physical = physical_indexes(gpus)
    return [
        _with_health(gpu, "metrics exporter reports gpu_health 0")
        if any(_matches(verdict, gpu, physical[gpu.id]) for verdict in unhealthy) else gpu
        for gpu in gpus
    ]


def physical_indexes(gpus: Sequence[GpuInfo]) -> dict[str, int]:
    """GpuInfo.id -> index of its physical GPU (partitions of one GPU share it)."""
    order: dict[str, int] = {}
    result = {}
    for gpu in gpus:
        parent = gpu.partition.parent_bdf if gpu.partition else gpu.pci_bdf
        result[gpu.id] = order.setdefault(parent, len(order))
    return result


def _matches(verdict: ExporterVerdict, gpu: GpuInfo, physical_index: int) -> bool:
    if verdict.gpu_id == gpu.id:
        return True
    if verdict.gpu_id != str(physical_index):
        return False
    return verdict.partition_id is None or gpu.partition is None or verdict.partition_id == str(gpu.partition.index)


# ---- exporter polling -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExporterReading:
    verdicts: list[ExporterVerdict] = field(default_factory=list)
    error: str | None = None
    stale: bool = False  # verdicts are last-known ones, kept after a failed poll


async def fetch_exporter_text(url: str, *, timeout_s: float = DEFAULT_EXPORTER_TIMEOUT_S) -> str:
    """One GET bounded by `timeout_s` overall; raises ExporterError on any failure."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
            if response.status != 200:
                raise ExporterError(f"{url} answered HTTP {response.status}")
            return await response.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError, OSError) as error:
        raise ExporterError(f"{url} unreachable: {type(error).__name__}: {error}") from None


class ExporterHealth:
    """Polls one exporter; remembers its last good verdicts for `stale_after_s`."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_EXPORTER_TIMEOUT_S,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._last: list[ExporterVerdict] = []
        self._last_at: float | None = None

    async def poll(self) -> ExporterReading:
        try:
            verdicts = parse_exporter_health(await fetch_exporter_text(self.url, timeout_s=self._timeout_s))
        except ExporterError as error:
            return ExporterReading(verdicts=self._last_known(), error=str(error), stale=True)
        self._last, self._last_at = verdicts, self._clock()
        return ExporterReading(verdicts=verdicts)

    def _last_known(self) -> list[ExporterVerdict]:
        if self._last_at is None or self._clock() - self._last_at > self._stale_after_s:
            return []
        return self._last
