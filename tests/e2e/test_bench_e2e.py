"""`rocshare-dev bench e2e` and `bench dra` at a tiny scale: the multi-node kubelet peer (`--node-count`,
with and without its baseline plugin, and with each node's DRA manager) and the multi-node agent
runner (rocshare_dev.devcluster.multiagent, device plugins or DRA drivers) take every pod of each
burst through bind and a real Allocate or NodePrepareResources to Running, and the figures come
out under the names `rocshare-dev bench all` reads. Each runs its own control plane (as the
benchmark does), so it leaves the session's cluster alone; about a minute each.
"""

from __future__ import annotations

import json

import pytest

from rocshare_dev.bench.dra import run_dra
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


def test_the_dra_bench_runs_every_pod_of_the_three_modes(tmp_path) -> None:
    """`rocshare-dev bench dra` at a tiny scale: DRA pods reach Running on simulated nodes whose
    agents are DRA drivers (`kubelet-peer --node-count --dra`, multiagent --dra), beside the plain
    and extender bursts, and each claim was prepared by its node's driver (the record it writes)."""
    figures = run_dra(nodes=2, pods=4, burst_timeout_s=90, work_dir=tmp_path / "work", json_out=None)
    assert figures["dra_running_pods"] == 4 and figures["dra_failed_pods"] == 0, figures
    assert figures["dra_allocated_claims"] == 4 and figures["dra_prepared_claims"] == 4, figures
    assert figures["dra_extender_running_pods"] == 4 and figures["dra_plain_running_pods"] == 4, figures
    assert figures["dra_running_pods_per_s"] > 0 and figures["dra_to_extender_running_ratio"] > 0
    assert figures["dra_cpu_s_by_process"].keys() >= {"kubelet-peer", "agents", "kube-scheduler"}
