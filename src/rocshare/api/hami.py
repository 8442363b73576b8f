"""HAMi compatibility codec: the annotations HAMi's scheduler and tools read, kept exact.

This is deliberately separate from rocshare's own versioned codecs (models.py,
allocation.py): these formats are HAMi's, unversioned and partly positional, and we write
them only so that HAMi-aware tooling and migrations keep working (DESIGN.md section 6).

* Node annotation `hami.io/node-amd-register`: a JSON array of device objects
  `{id, index, count, devmem, devcore, type, numa, mode, health, devicevendor, custominfo}`;
  like Go's `omitempty`, every field is left out when zero, false or empty. `custominfo`
  holds `pciBDF`, `cuPerWGP`, `xgmiPeers`, `computeQueues` (same omission rule).
* Pod annotation `hami.io/amd-devices-allocated`: `UUID,Type,MemMiB,CUcount:` per device;
  each container's devices end with `;`; init containers come first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord
from rocshare.api.gfx import effective_memory_scaling
from rocshare.api.models import GpuInfo, OperatingMode

DEVICE_VENDOR = "AMD"
_FIELD_SEPARATORS = str.maketrans({",": "-", ":": "-", ";": "-"})


class HamiFormatError(ValueError):
    """Text that is not in the HAMi format; says what is wrong."""


# ---- hami.io/node-amd-register ----------------------------------------------------------------


def node_register_entry(gpu: GpuInfo, *, operating_mode: OperatingMode, memory_scaling: float = 1.0,
                        compute_queues: int = 0) -> dict:
    """One device object; `devmem` is the registered VRAM (real VRAM x the pool's scaling, where the
    GPU can oversubscribe: see rocshare.api.gfx)."""
    custom = _omit_empty({
        "pciBDF": gpu.pci_bdf,
        "cuPerWGP": gpu.cu_per_wgp,
        "xgmiPeers": list(gpu.xgmi_peers),
        "computeQueues": compute_queues,
    })
    return _omit_empty({
        "id": gpu.id,
        "index": gpu.index,
        "count": gpu.split_count,
        "devmem": int((gpu.vram_mib or 0) * effective_memory_scaling(gpu.gfx_target_version, memory_scaling)),
        "devcore": gpu.cu_count,
        "type": gpu.product or f"gfx{gpu.gfx_target_version}",
        "numa": gpu.numa or 0,
        "mode": str(operating_mode),
        "health": gpu.healthy,
        "devicevendor": DEVICE_VENDOR,
        "custominfo": custom,
    })


def encode_node_register(gpus: Sequence[GpuInfo], *, operating_mode: OperatingMode, memory_scaling: float = 1.0,
                         compute_queues: Mapping[str, int] | None = None) -> str:
    queues = compute_queues or {}
    entries = [node_register_entry(gpu, operating_mode=operating_mode, memory_scaling=memory_scaling,
                                   compute_queues=queues.get(gpu.id, 0)) for gpu in gpus]
    return json.dumps(entries, separators=(",", ":"))


def decode_node_register(text: str) -> list[dict]:
    """The device objects, with omitted fields filled with their zero values."""
    try:
        entries = json.loads(text)
    except (json.JSONDecodeError, TypeError) as error:
        raise HamiFormatError(f"node register annotation is not JSON: {error}") from None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise HamiFormatError("node register annotation must be a JSON array of objects")
    return [_with_zero_values(entry) for entry in entries]


_ZERO_VALUES = {"id": "", "index": 0, "count": 0, "devmem": 0, "devcore": 0, "type": "", "numa": 0, "mode": "",
                "health": False, "devicevendor": "", "custominfo": {}}


def _with_zero_values(entry: dict) -> dict:
    return {**_ZERO_VALUES, **entry}


def _omit_empty(values: dict) -> dict:
    return {key: value for key, value in values.items() if value not in (0, "", False, None, [], {})}


# ---- hami.io/amd-devices-allocated ------------------------------------------------------------


@dataclass(frozen=True)
class HamiContainerDevice:
    uuid: str
    type: str
    memory_mib: int
    cu_count: int


def encode_pod_devices(record: AllocationRecord, *, device_types: Mapping[str, str],
                       container_names: Sequence[str] | None = None) -> str:
    """The annotation for `record`. `device_types` maps GpuInfo.id to its product name.

    `container_names` (the pod's containers, init containers first, in pod order) makes
    containers that hold no GPU appear as empty `;` segments, as HAMi writes them.
    """
    containers = sorted(record.containers, key=lambda container: not container.init)
    by_name = {container.name: container for container in containers}
    names = list(container_names) if container_names is not None else [container.name for container in containers]
    segments = []
    for name in names:
        container = by_name.get(name)
        devices = container.devices if container else []
        segments.append("".join(
            f"{device.gpu_id},{_type_field(device_types.get(device.gpu_id, ''))},{device.memory_mib},{device.cu_count}:"
            for device in devices
        ) + ";")
    return "".join(segments)


def _type_field(product: str) -> str:
    # The format is positional: a separator inside the type would shift every later field.
    return product.translate(_FIELD_SEPARATORS)


def decode_pod_devices(text: str) -> list[list[HamiContainerDevice]]:
    """Per container (init containers first), its devices; raises HamiFormatError."""
    if text and not text.endswith(";"):
        raise HamiFormatError("pod devices annotation must end each container with ';'")
    return [_decode_container(segment) for segment in text.split(";")[:-1]]


def _decode_container(segment: str) -> list[HamiContainerDevice]:
    if segment and not segment.endswith(":"):
        raise HamiFormatError(f"container segment {segment!r} must end each device with ':'")
    return [_decode_device(part) for part in segment.split(":")[:-1]]


def _decode_device(part: str) -> HamiContainerDevice:
    fields = part.split(",")
    if len(fields) != 4:
        raise HamiFormatError(f"device {part!r} must be UUID,Type,MemMiB,CUcount")
    try:
        return HamiContainerDevice(fields[0], fields[1], int(fields[2]), int(fields[3]))
    except ValueError:
        raise HamiFormatError(f"device {part!r} has a non-integer memory or CU count") from None
