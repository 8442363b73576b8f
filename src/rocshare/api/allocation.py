"""The allocation record: the scheduler's committed decision, written on the pod.

The extender's bind writes it (annotation ``rocshare.io/allocation``) in the pod's
Binding, so the API server sets node and record in one write, under the pod's uid and
resourceVersion as preconditions; the node agent
serves the kubelet's Allocate calls from it and nothing else; the ledger is rebuilt
from these records on restart. Versioned JSON; decoding a record that does not
match is an error (an undecodable record keeps its GPUs blocked, never "free").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from rocshare.api.annotation_json import decode_annotation, encode_annotation
from rocshare.api.models import _Model

ALLOCATION_ANNOTATION = "rocshare.io/allocation"
"""Pod annotation holding the AllocationRecord JSON; written only by the extender's bind."""

ALLOCATED_ANNOTATION = "rocshare.io/allocated"
"""Pod annotation the node agent sets (to the RFC 3339 time) once every container was served."""

ALLOCATION_ERROR_ANNOTATION = "rocshare.io/allocation-error"
"""Pod annotation the node agent sets when it refused the kubelet's Allocate, with why."""


class AllocationError(ValueError):
    """A record that cannot be decoded or is inconsistent; says what is wrong."""


class DeviceSlice(_Model):
    """What one container holds of one GPU (or partition)."""

    gpu_id: str = Field(alias="gpuId", min_length=1, description="GpuInfo.id of the device.")
    memory_mib: int = Field(alias="memoryMiB", ge=0, description="VRAM cap in MiB (the whole VRAM for a whole GPU).")
    cu_ranges: list[tuple[int, int]] = Field(
        default_factory=list, alias="cuRanges", description="Inclusive CU index ranges pinned by HSA_CU_MASK; empty = every CU."
    )
    cu_count: int = Field(alias="cuCount", ge=0, description="CUs the container may use.")
    whole: bool = Field(default=False, description="A whole GPU: no memory hook, no limits.")
    reserves_all_cores: bool = Field(
        default=False, alias="reservesAllCores", description="Holds the GPU's whole compute range (omitted gpucores, Exclusive)."
    )
    cores_pct: int | None = Field(
        default=None, alias="coresPct", ge=1, le=100,
        description="The gpucores percent the container asked (CU slices only): what quota and status count.",
    )

    @model_validator(mode="after")
    def _ranges_are_ordered(self) -> DeviceSlice:
        for low, high in self.cu_ranges:
            if low < 0 or high < low:
                raise ValueError(f"CU range {low}-{high} is not a valid inclusive range")
        return self


class ContainerAllocation(_Model):
    name: str = Field(min_length=1, description="Container name.")
    init: bool = Field(default=False, description="An init container.")
    sidecar: bool = Field(default=False, description="An init container with restartPolicy Always (runs beside the app).")
    devices: list[DeviceSlice] = Field(min_length=1, description="One entry per GPU, in the container's GPU order.")


class AllocationRecord(_Model):
    version: Literal[1] = 1
    node: str = Field(min_length=1, description="Node the pod was bound to.")
    containers: list[ContainerAllocation] = Field(min_length=1, description="Init containers first, in pod order.")
    oversubscribed: bool = Field(default=False, description="The pool scales VRAM above 1.0: set HIP_OVERSUBSCRIBE.")
    resize_generation: int | None = Field(
        default=None, alias="resizeGeneration", ge=1,
        description="The generation of the resize request (rocshare.api.resize) this record applies; absent: as bound.",
    )

    @property
    def generation(self) -> int:
        """0 for the record bind wrote; the applied resize request's generation after a resize."""
        return self.resize_generation or 0

    def gpu_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for container in self.containers:
            for device in container.devices:
                seen.setdefault(device.gpu_id, None)
        return list(seen)


def encode_record(record: AllocationRecord) -> str:
    return encode_annotation(record)


def decode_record(text: str) -> AllocationRecord:
    """Parse the annotation's text; raises AllocationError naming the problem."""
    return decode_annotation(text, AllocationRecord, annotation=ALLOCATION_ANNOTATION, error=AllocationError)


def render_cu_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """CU ranges as HSA_CU_MASK and the account's limits file write them: "0-15,32,40-47"."""
    return ",".join(f"{low}" if low == high else f"{low}-{high}" for low, high in ranges)
