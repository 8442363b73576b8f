"""Pure parsing of KFD topology text (/sys/class/kfd/kfd/topology/nodes/<n>/...).

Input is the raw text the scanner read; output is a frozen `KfdNode`. Facts encoded here
(DESIGN.md section 5): a GPU node has simd_count > 0; CU count = simd_count / simd_per_cu
(array_count x cu_per_simd_array also counts fused-off CUs); location_id = bus<<8 |
device<<3 | function; link type 11 is XGMI, 2 is PCIe. Malformed input raises
`KfdParseError` with a reason; it never raises anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LINK_TYPE_PCIE = 2
LINK_TYPE_XGMI = 11

# Heap types of mem_banks/<k>/properties: 1 = frame buffer public, 2 = frame buffer private.
# Heap 0 is system memory (CPU nodes, and APUs' GTT on some kernels): not VRAM.
_VRAM_HEAP_TYPES = (1, 2)

_MAX_U64 = (1 << 64) - 1
_LINK_KEYS = frozenset({"type", "node_to"})


class KfdParseError(ValueError):
    """A KFD entry whose content cannot be used; the message says why."""


@dataclass(frozen=True)
class RawKfdNode:
    """What the scanner read for one topology node; texts are None when missing."""

    node_id: int
    path: str
    properties_text: str | None
    gpu_id_text: str | None = None
    link_texts: tuple[str | None, ...] = ()  # io_links: direct links
    p2p_link_texts: tuple[str | None, ...] = ()  # p2p_links: indirect peer paths (through the host)
    mem_bank_texts: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class PciAddress:
    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def slot(self) -> tuple[int, int, int]:
        """domain, bus, device: what the partitions of one GPU have in common."""
        return (self.domain, self.bus, self.device)

    def with_function(self, function: int) -> PciAddress:
        return PciAddress(self.domain, self.bus, self.device, function)


@dataclass(frozen=True)
class KfdLink:
    link_type: int
    node_to: int
    direct: bool = True


@dataclass(frozen=True)
class KfdGpu:
    """A GPU (or partition) node of the KFD topology, parsed."""

    node_id: int
    path: str
    kfd_gpu_id: int
    cu_count: int
    simd_count: int
    gfx_target_version: int
    device_id: int
    pci: PciAddress
    render_minor: int | None
    unique_id: int
    hive_id: int
    num_xcc: int
    vram_bytes: int | None
    compute_queues: int = 0
    links: tuple[KfdLink, ...] = field(default=())
    array_count: int = 0
    """Shader arrays, simd_arrays_per_engine and cu_per_simd_array as KFD writes them; 0 when missing
    (rocshare.core.cu_topology reads where the kernel puts each CU mask bit from them)."""
    simd_arrays_per_engine: int = 0
    cu_per_simd_array: int = 0


@dataclass(frozen=True)
class KfdCpu:
    node_id: int


def parse_properties(text: str, keys: frozenset[str] | None = None) -> dict[str, int]:
    """`key value` lines into ints; lines that are not that are skipped (kernels add keys).

    With `keys`, only those are converted: links are read by the thousand on partitioned
    GPUs (63 x 64 on the MI300X CPX capture) and need two keys each.
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and (keys is None or parts[0] in keys):
            number = parse_int(parts[1])
            if number is not None:
                values[parts[0]] = number
    return values


def parse_int(text: str | None) -> int | None:
    """Decimal or 0x-hex integer, else None."""
    if text is None:
        return None
    try:
        return int(text)  # the common case: KFD writes decimal
    except ValueError:
        pass
    try:
        return int(text.strip(), 16) if text.strip().lower().startswith(("0x", "-0x")) else None
    except ValueError:
        return None


def pci_address(domain: int, location_id: int) -> PciAddress:
    return PciAddress(domain, (location_id >> 8) & 0xFF, (location_id >> 3) & 0x1F, location_id & 0x7)


def parse_node(raw: RawKfdNode) -> KfdGpu | KfdCpu | None:
    """A GPU node, a CPU node, or None for a node that is neither (e.g. an empty placeholder)."""
    if raw.properties_text is None:
        raise KfdParseError("properties file is missing or unreadable")
    props = parse_properties(raw.properties_text)
    if not props:
        raise KfdParseError("properties file holds no `key value` lines")
    if props.get("simd_count", 0) > 0:
        return _parse_gpu(raw, props)
    if not any(line.split()[:1] == ["simd_count"] for line in raw.properties_text.splitlines()):
        # KFD writes simd_count on every node (0 on CPUs): a file without it is not KFD's, and a
        # GPU whose file was garbled must show up as a problem, not vanish as "not a GPU".
        raise KfdParseError("properties file has no simd_count line")
    if "simd_count" not in props:
        raise KfdParseError("simd_count is not a number")
    if props.get("cpu_cores_count", 0) > 0:
        return KfdCpu(raw.node_id)
    return None


def _parse_gpu(raw: RawKfdNode, props: dict[str, int]) -> KfdGpu:
    return KfdGpu(
        node_id=raw.node_id,
        path=raw.path,
        kfd_gpu_id=parse_int(raw.gpu_id_text) or 0,
        cu_count=cu_count(props),
        simd_count=props["simd_count"],
        gfx_target_version=max(props.get("gfx_target_version", 0), 0),
        device_id=_optional(props, "device_id", 0, 0xFFFF),
        pci=pci_address(_optional(props, "domain", 0, 0xFFFF), _required(props, "location_id", 0, 0xFFFF)),
        render_minor=_render_minor(props),
        unique_id=_optional(props, "unique_id", 0, _MAX_U64),
        hive_id=_optional(props, "hive_id", 0, _MAX_U64),
        num_xcc=_optional(props, "num_xcc", 1, 64) or 1,
        vram_bytes=_vram_bytes(props, raw.mem_bank_texts),
        compute_queues=_optional(props, "num_cp_queues", 0, 1 << 16),
        links=_links(raw.link_texts, direct=True) + _links(raw.p2p_link_texts, direct=False),
        array_count=_optional(props, "array_count", 0, 1024),
        simd_arrays_per_engine=_optional(props, "simd_arrays_per_engine", 0, 1024),
        cu_per_simd_array=_optional(props, "cu_per_simd_array", 0, 1024),
    )


def cu_count(props: dict[str, int]) -> int:
    simd_per_cu = props.get("simd_per_cu", 0)
    if simd_per_cu <= 0:
        raise KfdParseError(f"simd_per_cu is {simd_per_cu}: cannot derive the CU count")
    cus, remainder = divmod(props["simd_count"], simd_per_cu)
    if remainder:
        raise KfdParseError(f"simd_count {props['simd_count']} is not a multiple of simd_per_cu {simd_per_cu}")
    return cus


def _render_minor(props: dict[str, int]) -> int | None:
    # Render minors start at 128; 0 means "none" in KFD (CPU nodes, GPUs without a render node).
    minor = props.get("drm_render_minor", 0)
    return minor if minor > 0 else None


def _required(props: dict[str, int], key: str, low: int, high: int) -> int:
    if key not in props:
        raise KfdParseError(f"{key} is missing")
    return _in_range(props, key, low, high)


def _optional(props: dict[str, int], key: str, default: int, high: int) -> int:
    return _in_range(props, key, 0, high) if key in props else default


def _in_range(props: dict[str, int], key: str, low: int, high: int) -> int:
    value = props[key]
    if not low <= value <= high:
        raise KfdParseError(f"{key} {value} is outside {low}..{high}")
    return value


def _vram_bytes(props: dict[str, int], bank_texts: tuple[str | None, ...]) -> int | None:
    banks = [parse_properties(text) for text in bank_texts if text]
    sizes = [bank.get("size_in_bytes", 0) for bank in banks if bank.get("heap_type") in _VRAM_HEAP_TYPES]
    if sum(sizes) > 0:
        return sum(sizes)
    # Older kernels without mem_banks still fill local_mem_size; newer ones write 0 there.
    return props.get("local_mem_size") or None


def _links(texts: tuple[str | None, ...], *, direct: bool) -> tuple[KfdLink, ...]:
    return tuple(link for text in texts if (link := parse_link(text, direct=direct)) is not None)


def parse_link(text: str | None, *, direct: bool = True) -> KfdLink | None:
    if not text:
        return None
    props = parse_properties(text, _LINK_KEYS)
    if "type" not in props or "node_to" not in props:
        return None
    return KfdLink(props["type"], props["node_to"], direct)
