"""`rocshare-dev bench hook`: what the in-container memory hook adds to a hipMalloc+hipFree pair.

Measured against the stub ROCm runtime (hook/stub, built from the real HIP headers; a real GPU's
allocation costs far more, so the hook's share of it is smaller there). hook-probe times each
pair in-process with CLOCK_MONOTONIC, without the hook and with it (LD_AUDIT, a 1024 MiB slice so
every pair is counted in the shared account), alternating runs so both see the same machine load.
Figures are per-run percentiles, the median over the runs; "added" is hooked minus bare at the
same percentile. Goal (issue 29): added p99 <= 1 us.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parents[3] / "hook"
PAIRS_PER_RUN = 20000
RUNS = 7


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=PAIRS_PER_RUN, help="pairs per run (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per side, alternating (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def _probe_run(pairs: int, env: dict[str, str]) -> dict:
    out = subprocess.run([str(HOOK_DIR / "build" / "hook-probe"), "bench", str(pairs)], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout)


def measure(pairs: int = PAIRS_PER_RUN, runs: int = RUNS) -> dict:
    subprocess.run(["make", "-C", str(HOOK_DIR), "-s"], check=True, capture_output=True, timeout=900)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HIP_", "HSA_", "LD_AUDIT"))}
    with tempfile.TemporaryDirectory(prefix="rocshare-hook-bench-") as account_dir:
        hooked_env = {**base, "LD_AUDIT": str(HOOK_DIR / "build" / "librocshare-hook.so"),
                      "HIP_DEVICE_MEMORY_LIMIT_0": "1024m", "ROCSHARE_HOOK_DIR": account_dir}
        bare, hooked = [], []
        for _ in range(runs):
            bare.append(_probe_run(pairs, base))
            hooked.append(_probe_run(pairs, hooked_env))

    def median(runs_: list[dict], key: str) -> int:
        return int(statistics.median(r[key] for r in runs_))

    figures = {
        "hook_pair_p50_ns_bare_stub": median(bare, "p50_ns"),
        "hook_pair_p99_ns_bare_stub": median(bare, "p99_ns"),
        "hook_pair_p50_ns_hooked_stub": median(hooked, "p50_ns"),
        "hook_pair_p99_ns_hooked_stub": median(hooked, "p99_ns"),
    }
    figures["hook_added_p50_ns_stub"] = figures["hook_pair_p50_ns_hooked_stub"] - figures["hook_pair_p50_ns_bare_stub"]
    figures["hook_added_p99_ns_stub"] = figures["hook_pair_p99_ns_hooked_stub"] - figures["hook_pair_p99_ns_bare_stub"]
    return {"figures": figures, "pairs_per_run": pairs, "runs_per_side": runs,
            "note": "measured against rocshare's stub ROCm runtime (hook/stub), not a GPU"}


def run(args: argparse.Namespace) -> int:
    report = measure(args.pairs, args.runs)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    f = report["figures"]
    print(f"hipMalloc+hipFree pair against the stub runtime, {args.runs} runs x {args.pairs} pairs per side:")
    print(f"  bare    p50 {f['hook_pair_p50_ns_bare_stub']} ns  p99 {f['hook_pair_p99_ns_bare_stub']} ns")
    print(f"  hooked  p50 {f['hook_pair_p50_ns_hooked_stub']} ns  p99 {f['hook_pair_p99_ns_hooked_stub']} ns")
    print(f"  added   p50 {f['hook_added_p50_ns_stub']} ns  p99 {f['hook_added_p99_ns_stub']} ns (goal p99 <= 1000 ns)")
    return 0
