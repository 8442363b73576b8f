"""The memory hook of a simulated node: a real LD_AUDIT library that limits nothing.

The agent verifies that a node's ``libamvgpu.so`` is an audit library for the node (an ELF
shared object exporting ``la_version``, rocshare_agent/audit_library.py), so a text file no
longer passes for "the hook". Simulated nodes run no container that would load it; they need
only a file the check accepts. This one is compiled once by gcc into .cache and copied into
each simulated node's hook folder by the harness (the agent runs with --hook-library=External:
it checks, it does not install). The real-node suite uses the hook the agent image ships.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT

SOURCE = """/* rocshare simulated node: an audit library that limits nothing (never loaded here). */
unsigned int la_version(unsigned int version) { return version; }
const char rocshare_hook_version[] = "rocshare-hook 0.0.0-simulated";
"""
CACHE = PROJECT_ROOT / ".cache" / "hook-stand-in"


def stand_in_library() -> Path:
    """The compiled stand-in, built on first use (gcc) and reused while its source is unchanged."""
    library, source = CACHE / "libamvgpu-stand-in.so", CACHE / "stand-in.c"
    if library.exists() and source.exists() and source.read_text() == SOURCE:
        return library
    CACHE.mkdir(parents=True, exist_ok=True)
    source.write_text(SOURCE)
    partial = library.with_suffix(".part")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(partial), str(source)], check=True,
                   capture_output=True, text=True)
    partial.rename(library)
    return library
