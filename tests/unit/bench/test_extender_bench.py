"""`rocshare-dev bench extender` on a tiny fleet: the report's shape, and that the bench runs
under the live extender's garbage-collector settings (the one shared `settle_heap`), then
hands the heap back unfrozen so the next setting settles its own caches."""

from __future__ import annotations

import gc

from rocshare_dev.bench import extender as bench
from rocshare_operator.extender import heap


def test_each_setting_is_timed_under_the_live_extenders_gc_settings(monkeypatch) -> None:
    settled: list[int] = []
    real = heap.settle_heap

    def settle() -> None:
        real()
        settled.append(gc.get_freeze_count())

    monkeypatch.setattr(heap, "settle_heap", settle)
    report = bench.measure([4], [0.5, 0.9], rounds=3)
    assert len(settled) == 2 and all(count > 0 for count in settled)
    assert gc.get_freeze_count() == 0
    for setting in report["settings"]:
        assert setting["nodes"] == 4 and setting["warm"]["rounds"] == 3 and setting["cold"]["rounds"] == 20
        assert 0 < setting["warm"]["p50_ms"] <= setting["warm"]["p99_ms"]


def test_the_extender_bench_reports_the_refreshers_cpu_apart_and_runs_without_it() -> None:
    with_refresher = bench.measure([4], [0.5], rounds=5)
    without = bench.measure([4], [0.5], rounds=5, refresh=False)
    assert with_refresher["refresher"] is True and without["refresher"] is False
    assert with_refresher["settings"][0]["warm"]["refresh_cpu_mean_ms"] >= 0
    assert "refresh_cpu_mean_ms" not in without["settings"][0]["warm"]


def test_collections_are_counted_and_placed_inside_or_between_decisions() -> None:
    pauses = bench.GcPauses()
    pauses.pauses = [(1.0, 1.1, 0), (2.05, 2.2, 1), (3.5, 3.6, 2), (4.9, 5.1, 0)]
    summary = pauses.summary(warm=[(2.0, 2.1), (5.0, 5.5), (1.2, 1.9)], cold=[(3.0, 3.4)])
    assert summary["collections"] == {"0": 2, "1": 1, "2": 1}
    assert summary["in_warm_decisions"] == 2  # the one starting inside (2.05) and the one running into one (4.9)
    assert summary["longest_in_warm_decisions_ms"] == 200.0 and summary["longest_pause_ms"]["2"] == 100.0
    assert summary["in_cold_decisions"] == 0 and summary["longest_in_cold_decisions_ms"] == 0.0
    with bench.GcPauses() as live:
        gc.collect(1)
    assert live.pauses and live.pauses[-1][2] == 1 and live.pauses[-1][0] <= live.pauses[-1][1]
