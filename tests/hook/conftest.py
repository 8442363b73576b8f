"""Fixtures for the in-container memory hook's tests: the hook, its stub ROCm runtime and hook-probe,
built once per session by `make -C hook` (which fetches the real ROCm headers through hook/deps.sh),
and a way to run a program under LD_AUDIT with a slice's environment."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

HOOK_DIR = Path(__file__).resolve().parents[2] / "hook"
MIB = 1 << 20


@dataclass(frozen=True)
class HookBuild:
    library: Path
    probe: Path
    stub_dir: Path

    def env(self, tmp_path: Path, hooked: bool = True, **extra: str) -> dict[str, str]:
        """A slice container's environment: the hook under LD_AUDIT, its account in tmp_path."""
        ours = ("HIP_", "HSA_", "LD_AUDIT", "ROCSHARE_", "ROCM_STUB_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
        env["ROCSHARE_HOOK_DIR"] = str(tmp_path)
        if hooked:
            env["LD_AUDIT"] = str(self.library)
        env.update(extra)
        return env

    def probe_json(self, env: dict[str, str], *args: str) -> dict:
        out = subprocess.run([str(self.probe), *args], env=env, capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)


@pytest.fixture(scope="session")
def hook_build() -> HookBuild:
    subprocess.run(["make", "-C", str(HOOK_DIR), "-s", "all", "real-runtime"], check=True, capture_output=True,
                   timeout=600)
    build = HOOK_DIR / "build"
    return HookBuild(build / "librocshare-hook.so", build / "hook-probe", build / "stub")
