"""The memory hook of a simulated node: a real LD_AUDIT library that limits nothing.

The agent verifies that a node's ``libamvgpu.so`` is an audit library for the node (an ELF
shared object exporting ``la_version``, rocshare_agent/audit_library.py), so a text file no
longer passes for "the hook". Simulated nodes run no container that would load it; they need
only a file the check accepts. This one is compiled once by gcc into .cache and copied into
each simulated node's hook folder by the harness (the agent runs with --hook-library=External:
it checks, it does not install). The real-node suite uses the hook the agent image ships.
"""

from __future__ import annotations

import os
import subprocess
import threading
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
    # Simulated nodes start in parallel (the chaos world's threads): each writes and builds under
    # names of its own and renames into place, so none reads or moves a file another is writing.
    own = f"{os.getpid()}.{threading.get_ident()}"
    own_source, partial = CACHE / f"stand-in.{own}.c", library.with_suffix(f".{own}.part")
    own_source.write_text(SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(partial), str(own_source)], check=True,
                   capture_output=True, text=True)
    partial.rename(library)
    own_source.rename(source)
    return library
