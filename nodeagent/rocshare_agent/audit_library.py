"""Is a file an LD_AUDIT library this node's loader can use? Read from its ELF headers.

The loader silently skips an audit library it cannot load (rtld-audit(7)): a text file, an
executable, a library for another architecture or one without ``la_version`` would leave a
slice with no memory limit while the node looked ready. So the hook is proved by what the
loader needs, read with pyelftools:

* an ELF shared object (``ET_DYN`` and not a position-independent executable);
* for this node's architecture: machine, word size and byte order (`NODE_TARGETS`);
* a defined, exported ``la_version`` in its dynamic symbol table (the audit entry point the
  loader calls first; without it the library is ignored).

rocshare's own hook also exports ``rocshare_hook_version``, a NUL-terminated string
"rocshare-hook <version>", which names the library in the MemoryHook condition; any other
audit library (HAMi's libamvgpu.so) is "an external audit library".

Invariant: the file is only read, never loaded (dlopen would run its constructors here).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

AUDIT_ENTRY = "la_version"
VERSION_SYMBOL = "rocshare_hook_version"
VERSION_PREFIX = "rocshare-hook "
EXTERNAL = "an external audit library"
_DF_1_PIE = 0x08000000  # DT_FLAGS_1 bit the linker sets on position-independent executables
_VERSION_MAX_BYTES = 256


@dataclass(frozen=True)
class ElfTarget:
    machine: str  # pyelftools' e_machine name
    elf_class: int  # 32 or 64
    little_endian: bool


NODE_TARGETS = {
    "x86_64": ElfTarget("EM_X86_64", 64, True),
    "aarch64": ElfTarget("EM_AARCH64", 64, True),
    "ppc64le": ElfTarget("EM_PPC64", 64, True),
    "s390x": ElfTarget("EM_S390", 64, False),
}
"""The ELF a node of each `platform.machine()` runs (the agent runs on the node it checks)."""


def node_target(machine: str | None = None) -> tuple[str, ElfTarget | None]:
    name = machine or platform.machine()
    return name, NODE_TARGETS.get(name)


class NotAnAuditLibrary(ValueError):
    """The file is not an audit library for this node; the message says why, after the path."""


@dataclass(frozen=True)
class AuditLibrary:
    version: str | None  # "rocshare-hook <version>" for rocshare's hook, None for any other

    @property
    def description(self) -> str:
        return self.version or EXTERNAL


def inspect_audit_library(stream: BinaryIO, *, arch: str, target: ElfTarget | None) -> AuditLibrary:
    """What `stream` holds; raises NotAnAuditLibrary with the reason when the loader would skip it."""
    try:
        elf = ELFFile(stream)
        _check_kind(elf)
        _check_target(elf, arch=arch, target=target)
        if not _exports_function(elf, AUDIT_ENTRY):
            raise NotAnAuditLibrary(f"does not export the audit entry point {AUDIT_ENTRY} (not an LD_AUDIT library)")
        return AuditLibrary(_rocshare_version(elf))
    except ELFError as error:
        raise NotAnAuditLibrary(f"is not a readable ELF file ({error})") from error


def _check_kind(elf: ELFFile) -> None:
    kind = elf.header["e_type"]
    if kind == "ET_EXEC" or (kind == "ET_DYN" and _flags_1(elf) & _DF_1_PIE):
        raise NotAnAuditLibrary("is an executable, not a shared library")
    if kind != "ET_DYN":
        raise NotAnAuditLibrary(f"is not a shared library (ELF type {kind})")


def _check_target(elf: ELFFile, *, arch: str, target: ElfTarget | None) -> None:
    if target is None:
        return  # an architecture this table does not know: the symbol check still applies
    found = ElfTarget(elf.header["e_machine"], elf.elfclass, elf.little_endian)
    if found != target:
        order = "little" if found.little_endian else "big"
        raise NotAnAuditLibrary(f"is built for {found.machine} ({found.elf_class}-bit, {order}-endian), "
                                f"not this node's {arch}")


def _flags_1(elf: ELFFile) -> int:
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            return next((tag.entry.d_val for tag in section.iter_tags("DT_FLAGS_1")), 0)
    return 0


def _dynamic_symbol(elf: ELFFile, name: str):
    for section in elf.iter_sections():
        if isinstance(section, SymbolTableSection) and section["sh_type"] == "SHT_DYNSYM":
            symbols = section.get_symbol_by_name(name) or []
            return next((s for s in symbols if s["st_shndx"] != "SHN_UNDEF"), None)
    return None


def _exports_function(elf: ELFFile, name: str) -> bool:
    symbol = _dynamic_symbol(elf, name)
    return (symbol is not None and symbol["st_info"]["type"] == "STT_FUNC"
            and symbol["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
            and symbol["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED"))


def _rocshare_version(elf: ELFFile) -> str | None:
    """The text of `rocshare_hook_version` (a char array in the file's read-only data)."""
    symbol = _dynamic_symbol(elf, VERSION_SYMBOL)
    if symbol is None or symbol["st_info"]["type"] != "STT_OBJECT":
        return None
    size = min(symbol["st_size"], _VERSION_MAX_BYTES)
    offsets = list(elf.address_offsets(symbol["st_value"], size))
    if not offsets:
        return None
    elf.stream.seek(offsets[0])
    text = elf.stream.read(size).split(b"\0", 1)[0].decode("ascii", "replace")
    return text if text.startswith(VERSION_PREFIX) else None
