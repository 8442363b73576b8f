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

Reading pods HAMi placed (HAMi 4707fb0: pkg/scheduler/scheduler.go onAddPod, pkg/device/devices.go
DecodePodDevices; HAMi's AMD device plugin, Project-HAMi/amd-device-plugin internal/pkg/plugin):
* HAMi's scheduler writes `hami.io/vgpu-node` (the node it chose) and `hami.io/vgpu-time` with
  `hami.io/amd-devices-allocated` (and `hami.io/amd-devices-to-allocate`) before it binds; its
  usage rebuild counts only pods with `hami.io/vgpu-node`, per device id in the devices annotation.
* HAMi's AMD plugin names a GPU by its AMD SMI UUID (`amdsmi_get_gpu_device_uuid`), laid out by
  amd_smi_lib's `amdsmi_uuid_gen` as `SSFFDDDD-0000-1000-80TT-UUUUWWWWWWWW`: DDDD the PCI device
  id, FF the partition index (0xff, or 0 on an unpartitioned GPU), and the GPU's 64-bit unique_id
  spread over SS (byte 7), TT (byte 6), UUUU (bytes 5-4), WWWWWWWW (bytes 3-0). The unique_id is
  what rocshare's ids carry (`GPU-<16 hex>`), so `rocshare_gpu_id` maps one to the other without
  the node's inventory. Ids in rocshare's own form (a HAMi scheduler reading rocshare's
  registration) are kept as they are.
* The plugin records the CUs it pinned, per pod and device, in `hami.io/amd-cu-allocated`: a JSON
  object `{device id: "0-3,8,10-12"}` (HSA's CU id list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rocshare.api.allocation import AllocationRecord
from rocshare.api.gfx import effective_memory_scaling
from rocshare.api.models import GpuInfo, OperatingMode
from rocshare.api.pod_lifecycle import is_sidecar

DEVICE_VENDOR = "AMD"
VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"
"""The node HAMi's scheduler chose; its usage rebuild skips pods without it."""
VGPU_TIME_ANNOTATION = "hami.io/vgpu-time"
"""When HAMi's scheduler chose it (Unix seconds)."""
POD_DEVICES_ANNOTATION = "hami.io/amd-devices-allocated"
CU_ALLOCATED_ANNOTATION = "hami.io/amd-cu-allocated"
"""Written by HAMi's AMD plugin at Allocate: the CUs it pinned, per device id."""
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


# ---- GPU ids ----------------------------------------------------------------------------------

_AMD_SMI_UUID = re.compile(
    r"^(?P<b7>[0-9a-f]{2})(?P<fcn>[0-9a-f]{2})(?P<did>[0-9a-f]{4})-0000-1000-80(?P<b6>[0-9a-f]{2})-"
    r"(?P<b54>[0-9a-f]{4})(?P<b30>[0-9a-f]{8})$", re.IGNORECASE)
_NO_PARTITION = (0xFF, 0)


def rocshare_gpu_id(hami_id: str) -> str:
    """The rocshare id of a GPU named by HAMi: an AMD SMI UUID becomes ``GPU-<16 hex of unique_id>``
    (``-p<k>`` for partition k >= 1); any other id is kept (rocshare's own ids, as a HAMi scheduler
    reading rocshare's registration writes them)."""
    found = _AMD_SMI_UUID.match(hami_id)
    if found is None:
        return hami_id
    unique_id = int(found["b7"] + found["b6"] + found["b54"] + found["b30"], 16)
    partition = int(found["fcn"], 16)
    suffix = "" if partition in _NO_PARTITION else f"-p{partition}"
    return f"GPU-{unique_id:016x}{suffix}"


def decode_cu_allocated(text: str) -> dict[str, list[tuple[int, int]]]:
    """`hami.io/amd-cu-allocated`: per rocshare GPU id, the inclusive CU ranges; raises HamiFormatError."""
    try:
        entries = json.loads(text)
    except (json.JSONDecodeError, TypeError) as error:
        raise HamiFormatError(f"{CU_ALLOCATED_ANNOTATION} is not JSON: {error}") from None
    if not isinstance(entries, dict) or not all(isinstance(value, str) for value in entries.values()):
        raise HamiFormatError(f"{CU_ALLOCATED_ANNOTATION} must be a JSON object of CU id lists")
    return {rocshare_gpu_id(gpu): _cu_ranges(ids) for gpu, ids in entries.items()}


def _cu_ranges(ids: str) -> list[tuple[int, int]]:
    ranges = []
    for part in (part.strip() for part in ids.split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise HamiFormatError(f"CU id list {ids!r}: {part!r} is not an id or a range") from None
        if first < 0 or last < first:
            raise HamiFormatError(f"CU id list {ids!r}: {part!r} is not a valid range")
        ranges.append((first, last))
    return ranges


# ---- pods HAMi placed, and what rocshare writes for HAMi's scheduler ---------------------------


@dataclass(frozen=True, slots=True)
class HamiPlacement:
    """What a pod carries of HAMi's decision (texts as written; decoded by rocshare.core.holdings)."""

    node: str
    """`hami.io/vgpu-node`, or "" when absent."""
    devices: str
    """`hami.io/amd-devices-allocated` as written."""
    cu_allocated: str | None
    """`hami.io/amd-cu-allocated` as written, None until HAMi's plugin has served the pod."""
    containers: tuple[tuple[str, bool, bool], ...]
    """(name, init, sidecar) of the pod's containers, init containers first, in pod order."""


def hami_placement(annotations: Mapping[str, str], spec: Mapping) -> HamiPlacement | None:
    """HAMi's decision on a pod, or None when it carries none (no devices annotation)."""
    devices = annotations.get(POD_DEVICES_ANNOTATION)
    if devices is None:
        return None
    containers = tuple((str(c.get("name", "")), True, is_sidecar(c, init=True))
                       for c in spec.get("initContainers") or ()) + \
        tuple((str(c.get("name", "")), False, False) for c in spec.get("containers") or ())
    return HamiPlacement(str(annotations.get(VGPU_NODE_ANNOTATION) or ""), devices,
                         annotations.get(CU_ALLOCATED_ANNOTATION), containers)


def companion_annotations(record: AllocationRecord, *, device_types: Mapping[str, str],
                          container_names: Sequence[str], now_s: int) -> dict[str, str]:
    """What HAMi's scheduler reads of a pod to count it (onAddPod): the node, the time, the devices.
    Not `hami.io/bind-phase`, `hami.io/bind-time` or `hami.io/amd-devices-to-allocate`: those are
    HAMi's handshake with its own device plugin, which must never try to serve rocshare's pods."""
    return {
        VGPU_NODE_ANNOTATION: record.node,
        VGPU_TIME_ANNOTATION: str(now_s),
        POD_DEVICES_ANNOTATION: encode_pod_devices(record, device_types=device_types, container_names=container_names),
    }
