"""Reading the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023, "openb") CSV files.

This is the I/O edge of the placement benchmark, so it lives in bench/, not in the core.
Node rows: ``sn,cpu_milli,memory_mib,gpu,model``. Pod rows: ``name,cpu_milli,memory_mib,
num_gpu,gpu_milli[,gpu_spec,...]`` (the multigpu files carry only the first five columns).
``gpu_milli`` is thousandths of one GPU per GPU; ``gpu_spec`` is a ``|`` list of accepted
models (empty: any). Rows that do not parse raise ValueError naming the file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli


def load_nodes(path: str | Path) -> list[TraceNode]:
    return [
        TraceNode(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"]), row["model"].strip())
        for row in _rows(path)
    ]


def load_pods(path: str | Path) -> list[TracePod]:
    return [_pod(row) for row in _rows(path)]


def _pod(row: dict[str, str]) -> TracePod:
    spec = tuple(sorted({part.strip() for part in (row.get("gpu_spec") or "").split("|") if part.strip()}))
    num_gpu, gpu_milli = int(row["num_gpu"]), int(row["gpu_milli"])
    if num_gpu < 0 or not 0 <= gpu_milli <= 1000 or (num_gpu > 1 and gpu_milli != 1000):
        raise ValueError(f"pod {row['name']}: num_gpu={num_gpu} gpu_milli={gpu_milli} is not a valid request")
    return TracePod(row["name"], int(row["cpu_milli"]), int(row["memory_mib"]), num_gpu, gpu_milli, spec)


def _rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = []
        for line, row in enumerate(reader, start=2):
            if None in row.values() or None in row:
                raise ValueError(f"{path}:{line}: wrong number of columns")
            rows.append(row)
        return rows
