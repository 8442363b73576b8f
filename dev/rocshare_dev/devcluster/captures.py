"""The real sysfs captures in ../shared/fixtures/sysfs, and the one synthetic change the
simulated fleets need: the MI210 capture is KFD topology only and carries no VRAM size, so
`mi210_with_synthetic_vram` copies it and gives each GPU node a 64 GiB frame-buffer bank
(mem_banks/0, heap_type 1), as the MI210 has. Everything that uses the copy says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT

FIXTURES = (PROJECT_ROOT / ".." / "shared" / "fixtures" / "sysfs").resolve()
MI210_VRAM_BYTES = 64 * 1024**3


def mi210_with_synthetic_vram(fixtures: Path, into: Path) -> Path:
    target = into / "mi210-synthetic-vram"
    if target.exists():
        return target
    shutil.copytree(fixtures / "mi210-8gpu-xgmi", target, symlinks=True)
    for node in (target / "class" / "kfd" / "kfd" / "topology" / "nodes").iterdir():
        properties = (node / "properties").read_text()
        if "simd_count" not in properties or "simd_count 0" in properties:
            continue  # a CPU node
        bank = node / "mem_banks" / "0"
        bank.mkdir(parents=True, exist_ok=True)
        (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {MI210_VRAM_BYTES}\nflags 0\nwidth 4096\n")
    return target


def mi210_resized(fixtures: Path, into: Path, *, gpus: int, vram_mib: int, cu_count: int) -> Path:
    """A copy of the MI210 capture with synthetic sizes, for the trace replay's nodes: the first
    `gpus` GPU nodes kept (the others and links to them removed), each with `cu_count` CUs
    (simd_count = cu_count x simd_per_cu) and a `vram_mib` frame-buffer bank. Everything else
    (gfx target, PCI addresses, unique ids, XGMI links among the kept GPUs) is the capture's."""
    target = into / f"mi210-{gpus}gpu-{cu_count}cu-{vram_mib}mib"
    if target.exists():
        return target
    shutil.copytree(fixtures / "mi210-8gpu-xgmi", target, symlinks=True)
    nodes = target / "class" / "kfd" / "kfd" / "topology" / "nodes"
    gpu_nodes = sorted((node for node in nodes.iterdir() if _is_gpu(node)), key=lambda node: int(node.name))
    dropped = {node.name for node in gpu_nodes[gpus:]}
    for node in gpu_nodes[gpus:]:
        shutil.rmtree(node)
    for node in nodes.iterdir():
        _drop_links(node, dropped)
        if not _is_gpu(node):
            continue
        props = dict(line.split(" ", 1) for line in (node / "properties").read_text().splitlines() if " " in line)
        simd_count = cu_count * int(props.get("simd_per_cu", "4"))
        text = (node / "properties").read_text().replace(f"simd_count {props['simd_count']}", f"simd_count {simd_count}")
        (node / "properties").write_text(text)
        bank = node / "mem_banks" / "0"
        bank.mkdir(parents=True, exist_ok=True)
        (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {vram_mib * 1024**2}\nflags 0\nwidth 4096\n")
    return target


def _is_gpu(node: Path) -> bool:
    properties = (node / "properties").read_text()
    return "simd_count" in properties and "simd_count 0\n" not in properties


def _drop_links(node: Path, dropped: set[str]) -> None:
    for kind in ("io_links", "p2p_links"):
        folder = node / kind
        if not folder.is_dir():
            continue
        kept = [link for link in sorted(folder.iterdir(), key=lambda p: int(p.name))
                if not any(line == f"node_to {name}" for name in dropped
                           for line in (link / "properties").read_text().splitlines())]
        texts = [(link / "properties").read_text() for link in kept]
        for link in list(folder.iterdir()):
            shutil.rmtree(link)
        for number, text in enumerate(texts):
            (folder / str(number)).mkdir()
            (folder / str(number) / "properties").write_text(text)
        count_key = f"{kind}_count"
        props = (node / "properties").read_text()
        lines = [f"{count_key} {len(texts)}" if line.startswith(count_key + " ") else line for line in props.splitlines()]
        (node / "properties").write_text("\n".join(lines) + "\n")


MI300X_XCC_PER_GPU = 8
MI300X_VRAM_BYTES = 192 * 1024**3


def mi300x_spx(fixtures: Path, into: Path) -> Path:
    """**Derived**, not captured: the MI300X capture (CPX mode, one KFD node per XCC) turned into
    SPX mode, one KFD node per GPU holding its 8 XCCs. Per physical GPU the first partition node
    (PCI function 0) is kept and the other partition nodes and every link to them are removed.
    Computed fields of each kept node: ``num_xcc`` 8 (was 1) and ``simd_count`` 8 x the partition's
    (152 -> 1216, so 304 CUs). ``array_count`` (4), ``simd_arrays_per_engine`` (1) and
    ``cu_per_simd_array`` (10) stay as captured: the kernel writes one XCC's shader arrays there
    (max_sh_per_se x max_shader_engines of the device's gfx config, the same in every mode).
    **Synthetic**, as in the MI210 copy: a 192 GiB frame-buffer bank (mem_banks/0, heap_type 1) per
    GPU, the MI300X's VRAM; the capture has no VRAM size. Everything else (gfx target, PCI address, unique id, XGMI links between the kept nodes) is the
    capture's."""
    target = into / "mi300x-8gpu-spx-derived"
    if target.exists():
        return target
    shutil.copytree(fixtures / "mi300x-8gpu-cpx", target, symlinks=True)
    nodes = target / "class" / "kfd" / "kfd" / "topology" / "nodes"
    dropped = set()
    for node in sorted(nodes.iterdir(), key=lambda node: int(node.name)):
        if not _is_gpu(node):
            continue
        props = _properties(node)
        if int(props["location_id"]) & 0x7:  # PCI function > 0: a partition past the first
            dropped.add(node.name)
    for name in dropped:
        shutil.rmtree(nodes / name)
    for node in nodes.iterdir():
        _drop_links(node, dropped)
        if not _is_gpu(node):
            continue
        props = _properties(node)
        simd_count = int(props["simd_count"]) * MI300X_XCC_PER_GPU
        lines = [f"simd_count {simd_count}" if line.startswith("simd_count ") else
                 f"num_xcc {MI300X_XCC_PER_GPU}" if line.startswith("num_xcc ") else line
                 for line in (node / "properties").read_text().splitlines()]
        (node / "properties").write_text("\n".join(lines) + "\n")
        bank = node / "mem_banks" / "0"
        bank.mkdir(parents=True, exist_ok=True)
        (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {MI300X_VRAM_BYTES}\nflags 0\nwidth 8192\n")
    (target / "DERIVED.txt").write_text(mi300x_spx.__doc__ or "")
    return target


def _properties(node: Path) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in (node / "properties").read_text().splitlines() if " " in line)
