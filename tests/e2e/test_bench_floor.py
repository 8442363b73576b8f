"""`rocshare-dev bench floor` at a tiny scale: rocshare's pod policies default the floor's pods
(and leave the plain namespace alone), every floor pod goes through the Go floor extender's bind
and carries a rocshare record, both bursts run every pod, and the figures come out. Its own
control plane, about half a minute."""

from __future__ import annotations

import json

import pytest

from rocshare_dev.bench.floor import run_floor

pytestmark = pytest.mark.e2e


def test_the_floor_takes_every_pod_through_rocshares_configuration(tmp_path) -> None:
    out = tmp_path / "floor.json"
    figures = run_floor(nodes=4, pods=12, rounds=1, burst_timeout_s=90, json_out=out)
    assert figures["floor_all_ran"], figures
    assert figures["floor_extender_binds_by_round"] == [13], "the burst's 12 pods and the warm-up, all bound by it"
    assert figures["floor_pods_as_rocshare_binds_by_round"] == [12], figures
    assert figures["floor_ratio_to_plain"] > 0 and len(figures["floor_ratio_to_plain_by_round"]) == 1
    assert {"floor-extender", "kube-apiserver", "kube-scheduler"} <= set(figures["floor_cpu_s_by_process"])
    assert json.loads(out.read_text()) == figures
