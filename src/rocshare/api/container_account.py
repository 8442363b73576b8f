"""The container's account folder (docs/container-account.md): its fixed paths, the slice's limits
file the agent writes (text, version 1) and the usage file the memory hook writes (binary,
version 3). Pure codecs, no I/O; the agent reads both as untrusted input, so every decoder is
bounded and raises AccountFormatError on anything it does not expect.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rocshare.api.allocation import DeviceSlice, render_cu_ranges
from rocshare.api.container_env import HOOK_CONTAINER_DIR

ACCOUNT_CONTAINER_DIR = f"{HOOK_CONTAINER_DIR}/account"
"""The usage folder, read-write in the container (the hook writes USAGE_FILE there)."""
SLICE_CONTAINER_DIR = f"{HOOK_CONTAINER_DIR}/slice"
"""The slice folder, read-only in the container (the agent writes LIMITS_FILE there)."""
ACCOUNT_DIR_ENV = "ROCSHARE_ACCOUNT_DIR"
SLICE_DIR_ENV = "ROCSHARE_SLICE_DIR"
USAGE_DIR = "usage"
"""The usage folder's name under an account's host folder."""
SLICE_DIR = "slice"
LIMITS_FILE = "limits"
USAGE_FILE = "usage.v3.acct"
DEFAULT_ACCOUNT_ROOT = "/var/lib/rocshare/accounts"

LIMITS_MAX_BYTES = 4096
LIMITS_HEADER = "rocshare-limits 1"
MAX_POSITIONS = 16
"""GPU positions the hook has counters for (HOOK_MAX_DEVICES)."""
ACCOUNT_SLOTS = 256

_SLOT = struct.Struct("<iIQ16Q")  # pid, pid namespace, start ticks, used bytes per position
_HEADER = struct.Struct("<II")    # high water slots, padding
_NOTE = struct.Struct("<II240s")  # busy, count, text
_PEAK = struct.Struct("<16Q")
USAGE_FILE_BYTES = _HEADER.size + ACCOUNT_SLOTS * _SLOT.size + _NOTE.size + _PEAK.size
assert USAGE_FILE_BYTES == 37248


class AccountFormatError(ValueError):
    """An account file that is not what the contract says; the message says how."""


@dataclass(frozen=True)
class SliceLimits:
    """What the agent writes into `slice/limits`: per GPU position, the memory limit and CU ranges."""

    generation: int
    memory_bytes: Mapping[int, int]
    cu_ranges: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """What the hook's account says (the container's own word): per GPU position."""

    used_bytes: Mapping[int, int]
    peak_bytes: Mapping[int, int]
    processes: int
    refusals: int


def file_generation(record_generation: int) -> int:
    """The limits file's generation for an allocation record's (0 as bound, n after resize n): one
    more, so the file Allocate writes (1) is older than the first resize's (2); the contract has it
    larger on every write for the same container."""
    return record_generation + 1


def limits_for(devices: Sequence[DeviceSlice], generation: int) -> SliceLimits:
    """The limits file of a container holding `devices` (its GPU positions): one memory line per
    slice (a whole GPU has none), its CU ranges when it has some. The one rule for both modes."""
    memory = {i: device.memory_mib * 1024 * 1024 for i, device in enumerate(devices) if not device.whole}
    masks = {i: render_cu_ranges(device.cu_ranges) for i, device in enumerate(devices)
             if device.cu_ranges and not device.whole}
    return SliceLimits(generation=generation, memory_bytes=memory, cu_ranges=masks)


def encode_limits(limits: SliceLimits) -> str:
    lines = [LIMITS_HEADER, f"generation {limits.generation}"]
    lines += [f"memory {i} {limits.memory_bytes[i]}" for i in sorted(limits.memory_bytes)]
    lines += [f"cu-mask {i} {limits.cu_ranges[i]}" for i in sorted(limits.cu_ranges)]
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > LIMITS_MAX_BYTES:
        raise AccountFormatError(f"limits file would be {len(text)} bytes, more than {LIMITS_MAX_BYTES}")
    return text


def _decimal(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise AccountFormatError(f"{what}: {text[:40]!r} is not an unsigned decimal")
    value = int(text)
    if value >= 1 << 64:
        raise AccountFormatError(f"{what}: {value} does not fit 64 bits")
    return value


MAX_CUS = 256  # the hook's mask holds 8 words


def _cu_ranges(text: str) -> str:
    """A cu-mask line's ranges as the hook takes them (hook/src/limits.c parse_cu_mask_line):
    `<cu>[-<cu>]` joined by commas, each CU below MAX_CUS, each range low <= high, at least one."""
    for item in text.split(","):
        low_text, dash, high_text = item.partition("-")
        low = _decimal(low_text, "cu-mask CU")
        high = _decimal(high_text, "cu-mask CU") if dash else low
        if low > high or high >= MAX_CUS:
            raise AccountFormatError(f"cu-mask range {item[:40]!r}: not low <= high < {MAX_CUS}")
    return text


def decode_limits(data: bytes) -> SliceLimits:
    """The hook's rules (hook/src/limits.c), so the agent reports what the hook enforces."""
    if len(data) > LIMITS_MAX_BYTES:
        raise AccountFormatError(f"limits file is larger than {LIMITS_MAX_BYTES} bytes")
    if b"\0" in data:
        raise AccountFormatError("limits file holds a NUL byte")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise AccountFormatError("limits file is not ASCII") from None
    if not text.startswith(LIMITS_HEADER + "\n"):
        raise AccountFormatError("limits file is not version 1")
    if not text.endswith("\n"):
        raise AccountFormatError("limits file ends inside a line")
    generation, memory, masks = 0, {}, {}
    for line in text.split("\n")[1:-1]:
        word, _, rest = line.partition(" ")
        if word == "generation":
            generation = _decimal(rest, "generation")
        elif word == "memory":
            position_text, _, bytes_text = rest.partition(" ")
            position = _decimal(position_text, "memory position")
            if position >= MAX_POSITIONS or position in memory:
                raise AccountFormatError(f"memory line for position {position}: out of range or repeated")
            memory[position] = _decimal(bytes_text, "memory bytes")
        elif word == "cu-mask":
            position_text, _, ranges = rest.partition(" ")
            position = _decimal(position_text, "cu-mask position")
            if position >= MAX_POSITIONS or position in masks:
                raise AccountFormatError(f"cu-mask line for position {position}: out of range or repeated")
            masks[position] = _cu_ranges(ranges)
    return SliceLimits(generation=generation, memory_bytes=memory, cu_ranges=masks)


def decode_usage(data: bytes) -> Usage:
    """The hook's usage file: exactly USAGE_FILE_BYTES; a GPU's use is the sum over slots whose pid
    is not 0, processes are slots whose pid is positive. Sums are capped at 2^64 - 1 (a forged file
    cannot make a number the exporter cannot print)."""
    if len(data) != USAGE_FILE_BYTES:
        raise AccountFormatError(f"usage file is {len(data)} bytes, not {USAGE_FILE_BYTES}")
    high_water, _ = _HEADER.unpack_from(data, 0)
    used = [0] * MAX_POSITIONS
    processes = 0
    for i in range(min(high_water, ACCOUNT_SLOTS)):
        pid, _ns, _ticks, *slot_used = _SLOT.unpack_from(data, _HEADER.size + i * _SLOT.size)
        if pid == 0:
            continue
        processes += pid > 0
        used = [min(total + part, (1 << 64) - 1) for total, part in zip(used, slot_used)]
    note_offset = _HEADER.size + ACCOUNT_SLOTS * _SLOT.size
    _busy, refusals, _text = _NOTE.unpack_from(data, note_offset)
    peak = _PEAK.unpack_from(data, note_offset + _NOTE.size)
    return Usage(used_bytes={i: used[i] for i in range(MAX_POSITIONS)},
                 peak_bytes={i: peak[i] for i in range(MAX_POSITIONS)}, processes=processes, refusals=refusals)
