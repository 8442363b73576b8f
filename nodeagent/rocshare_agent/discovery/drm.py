"""Pure parsing of amdgpu DRM device folders (/sys/class/drm/card<N>/device/...).

The scanner hands over the raw texts of the attributes listed in `DRM_ATTRIBUTES`;
`parse_drm_device` turns them into a `DrmDevice`. Quirks handled here: `numa_node` is -1
on desktops and APUs (unknown, not an error), `product_name` is empty or missing on Radeon
boards, `unique_id` is hex, partition modes come upper-case ("CPX", "NPS1").
"""

from __future__ import annotations

from dataclasses import dataclass

from rocshare_agent.discovery.kfd import PciAddress, parse_int

DRM_ATTRIBUTES = (
    "uevent",
    "mem_info_vram_total",
    "mem_info_vram_used",
    "unique_id",
    "product_name",
    "numa_node",
    "current_compute_partition",
    "current_memory_partition",
    "device",
    "revision",
)

AMD_VENDOR_ID = 0x1002


@dataclass(frozen=True)
class RawDrmDevice:
    card: int
    path: str  # the card's `device` folder
    texts: dict[str, str | None]
    link_name: str | None = None  # basename the `device` symlink resolves to, when it is one


@dataclass(frozen=True)
class DrmDevice:
    card: int
    path: str
    pci: PciAddress | None
    vram_total_bytes: int | None
    product_name: str
    numa_node: int | None
    unique_id: int | None
    compute_partition: str | None
    memory_partition: str | None
    device_id: int | None
    revision: int | None = None


def parse_uevent(text: str | None) -> dict[str, str]:
    values = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def parse_pci_address(text: str | None) -> PciAddress | None:
    """`0000:c1:00.0` into its parts; None when it is not one."""
    try:
        domain, bus, rest = (text or "").split(":")
        device, function = rest.split(".")
        return PciAddress(int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return None


def is_amdgpu(raw: RawDrmDevice) -> bool:
    uevent = parse_uevent(raw.texts.get("uevent"))
    return uevent.get("DRIVER") == "amdgpu" or uevent.get("PCI_ID", "").upper().startswith("1002:")


def parse_drm_device(raw: RawDrmDevice) -> DrmDevice:
    uevent = parse_uevent(raw.texts.get("uevent"))
    pci = parse_pci_address(uevent.get("PCI_SLOT_NAME")) or parse_pci_address(raw.link_name)
    return DrmDevice(
        card=raw.card,
        path=raw.path,
        pci=pci,
        vram_total_bytes=_positive(raw.texts.get("mem_info_vram_total")),
        product_name=(raw.texts.get("product_name") or "").strip(),
        numa_node=_numa(raw.texts.get("numa_node")),
        unique_id=_hex(raw.texts.get("unique_id")),
        compute_partition=_mode(raw.texts.get("current_compute_partition")),
        memory_partition=_mode(raw.texts.get("current_memory_partition")),
        device_id=_device_id(raw.texts.get("device"), uevent.get("PCI_ID")),
        revision=parse_int(raw.texts.get("revision")),
    )


def _positive(text: str | None) -> int | None:
    value = parse_int(text)
    return value if value is not None and value > 0 else None


def _numa(text: str | None) -> int | None:
    value = parse_int(text)
    return value if value is not None and value >= 0 else None


def _hex(text: str | None) -> int | None:
    try:
        value = int((text or "").strip(), 16)
    except ValueError:
        return None
    return value or None


def _mode(text: str | None) -> str | None:
    mode = (text or "").strip().lower()
    return mode or None


def _device_id(device_text: str | None, pci_id: str | None) -> int | None:
    if device_text:
        return parse_int(device_text)
    _, sep, device = (pci_id or "").partition(":")
    return parse_int("0x" + device) if sep and device else None
