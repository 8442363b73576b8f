"""`rocshare-dev bench e2e` at a tiny scale: the multi-node kubelet peer (`--node-count`, with and
without its baseline plugin) and the multi-node agent runner (rocshare_dev.devcluster.multiagent) take
every pod of both bursts through bind and a real Allocate to Running, and the figures come out
under the names `rocshare-dev bench all` reads. Runs its own control plane (as the benchmark does),
so it leaves the session's cluster alone; about a minute.
"""

from __future__ import annotations

import json

import pytest

from rocshare_dev.bench.e2e import run_e2e

pytestmark = pytest.mark.e2e


def test_both_bursts_run_every_pod(tmp_path) -> None:
    out = tmp_path / "e2e.json"
    figures = run_e2e(nodes=3, pods=6, burst_timeout_s=90, work_dir=tmp_path / "work", json_out=out)
    assert figures["e2e_running_pods"] == 6 and figures["e2e_failed_pods"] == 0, figures
    assert figures["e2e_baseline_running_pods"] == 6 and figures["e2e_baseline_failed_pods"] == 0, figures
    assert figures["e2e_pods_per_s"] > 0 and figures["e2e_baseline_pods_per_s"] > 0
    assert figures["e2e_latency_p99_ms"] >= figures["e2e_latency_p50_ms"] > 0
    assert json.loads(out.read_text()) == figures
    assert not (tmp_path / "work").exists(), "after a run that worked, the folder goes unless keep=True"
