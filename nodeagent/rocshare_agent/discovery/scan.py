"""Walk a sysfs root and hand raw texts to the pure parsers (the I/O half of discovery).

Layout read (DESIGN.md section 5): `class/kfd/kfd/topology/nodes/<n>/{properties,gpu_id,
io_links,p2p_links,mem_banks}`, `class/drm/card<N>/device/...`, and the partition platform
devices `devices/platform/amdgpu_xcp_<n>` (new kernels) or `amdgpu_xcp.<n>` (older ones),
whose `drm/` folder names the partition's card and render node.
"""

from __future__ import annotations

import re
from pathlib import Path

from rocshare_agent.discovery.drm import DRM_ATTRIBUTES, RawDrmDevice
from rocshare_agent.discovery.kfd import RawKfdNode
from rocshare_agent.discovery.sysfs import list_names, numbered_children, read_text, resolved_name

KFD_NODES = Path("class/kfd/kfd/topology/nodes")
DRM_CLASS = Path("class/drm")
PLATFORM_DEVICES = Path("devices/platform")

_CARD = re.compile(r"^card(\d+)$")  # not card0-DP-1: those are connectors
_RENDER = re.compile(r"^renderD(\d+)$")
_XCP = re.compile(r"^amdgpu_xcp[_.](\d+)$")


def kfd_nodes_dir(sysfs_root: Path) -> Path:
    return sysfs_root / KFD_NODES


def scan_kfd(sysfs_root: Path) -> list[RawKfdNode]:
    return [_raw_node(node_id, path) for node_id, path in numbered_children(kfd_nodes_dir(sysfs_root))]


def _raw_node(node_id: int, path: Path) -> RawKfdNode:
    return RawKfdNode(
        node_id=node_id,
        path=str(path),
        properties_text=read_text(path / "properties"),
        gpu_id_text=read_text(path / "gpu_id"),
        link_texts=tuple(_child_properties(path / "io_links")),
        p2p_link_texts=tuple(_child_properties(path / "p2p_links")),
        mem_bank_texts=tuple(_child_properties(path / "mem_banks")),
    )


def _child_properties(folder: Path) -> list[str | None]:
    # Plain string paths: pathlib's joins cost more than the reads on 4,000 link files.
    base = str(folder)
    return [read_text(f"{base}/{name}/properties") for name in list_names(folder) if name.isdigit()]


def scan_drm(sysfs_root: Path) -> list[RawDrmDevice]:
    devices = []
    for name in list_names(sysfs_root / DRM_CLASS):
        match = _CARD.match(name)
        if match:
            device = sysfs_root / DRM_CLASS / name / "device"
            texts = {attribute: read_text(device / attribute) for attribute in DRM_ATTRIBUTES}
            devices.append(RawDrmDevice(int(match[1]), str(device), texts, resolved_name(device)))
    return sorted(devices, key=lambda device: device.card)


def scan_xcp_cards(sysfs_root: Path) -> dict[int, int]:
    """Render minor -> card number of each partition platform device."""
    cards = {}
    for name in list_names(sysfs_root / PLATFORM_DEVICES):
        if _XCP.match(name):
            entries = list_names(sysfs_root / PLATFORM_DEVICES / name / "drm")
            card = _first_number(_CARD, entries)
            render = _first_number(_RENDER, entries)
            if card is not None and render is not None:
                cards[render] = card
    return cards


def _first_number(pattern: re.Pattern[str], names: list[str]) -> int | None:
    for name in names:
        match = pattern.match(name)
        if match:
            return int(match[1])
    return None
