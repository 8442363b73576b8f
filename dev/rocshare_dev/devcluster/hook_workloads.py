"""The demo's GPU processes where no GPU exists: for every slice container the kubelet peer
admitted, one hook-probe (hook/build: the stub ROCm runtime) runs under rocshare's real memory hook
with what the container was handed -- its environment, and its account folder at the host paths
its mounts name (docs/container-account.md) -- and holds half of its first GPU's slice until it is
stopped. Each node agent's monitor then reports the container from its account, so HAMi's
per-container panels and rocshare's own have data on the demo.

`probe_env` is pure (the environment from a runtime spec); `start` runs the processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocshare.api.container_account import ACCOUNT_CONTAINER_DIR, ACCOUNT_DIR_ENV, SLICE_CONTAINER_DIR, SLICE_DIR_ENV
from rocshare.api.container_env import LD_AUDIT, memory_limit_name
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT
from rocshare_dev.devcluster.simnode import runtime_specs

HOOK_BUILD = PROJECT_ROOT / "hook" / "build"
MIB = 1024 * 1024
_OURS = ("HIP_", "HSA_", "ROCR_", "LD_AUDIT", "ROCSHARE_", "ROCM_STUB_")


@dataclass(frozen=True)
class Probe:
    namespace: str
    pod: str
    container: str
    hold_bytes: int
    env: dict[str, str]


def probe_env(spec: Mapping[str, Any], *, hook_library: Path, base_env: Mapping[str, str]) -> dict[str, str] | None:
    """The environment of a probe standing in for the container of `spec` (the kubelet peer's record:
    envs, mounts); None when the container has no account folder (a whole GPU, no hook)."""
    envs = dict(spec.get("envs") or {})
    mounts = {mount["containerPath"]: mount["hostPath"] for mount in spec.get("mounts") or []}
    if ACCOUNT_CONTAINER_DIR not in mounts or SLICE_CONTAINER_DIR not in mounts or memory_limit_name(0) not in envs:
        return None
    env = {key: value for key, value in base_env.items() if not key.startswith(_OURS)}
    env.update(envs)
    env.update({LD_AUDIT: str(hook_library), ACCOUNT_DIR_ENV: mounts[ACCOUNT_CONTAINER_DIR],
                SLICE_DIR_ENV: mounts[SLICE_CONTAINER_DIR], "ROCM_STUB_VRAM_MIB": str(1 << 20)})
    return env


def probes_for(pods: list[dict]) -> list[Probe]:
    """One probe per slice container whose first GPU is limited, holding half of that limit."""
    found = []
    for pod in pods:
        meta = pod["metadata"]
        for container, spec in sorted((runtime_specs(pod) or {}).items()):
            env = probe_env(spec, hook_library=HOOK_BUILD / "librocshare-hook.so", base_env=os.environ)
            if env is None:
                continue
            limit_mib = int(env[memory_limit_name(0)].rstrip("m"))
            found.append(Probe(meta["namespace"], meta["name"], container, limit_mib * MIB // 2, env))
    return found


def start(pods: list[dict], log_dir: Path) -> dict[str, int]:
    """Build the hook and its probe, start one holding probe per slice container; name -> pid."""
    subprocess.run(["make", "-s", "-C", str(PROJECT_ROOT / "hook"), "all"], check=True, timeout=600)
    log_dir.mkdir(parents=True, exist_ok=True)
    pids = {}
    for probe in probes_for(pods):
        name = f"hook-probe/{probe.namespace}/{probe.pod}/{probe.container}"
        with open(log_dir / f"{probe.namespace}_{probe.pod}_{probe.container}.log", "ab") as log:
            process = subprocess.Popen([str(HOOK_BUILD / "hook-probe"), "hold", str(probe.hold_bytes)], env=probe.env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                       start_new_session=True)
        answer = json.loads(process.stdout.readline() or "{}")
        process.stdout.close()
        if answer.get("result") != "hipSuccess":
            raise RuntimeError(f"{name}: hook-probe hold {probe.hold_bytes} answered {answer}")
        pids[name] = process.pid
    return pids
