"""`rocshare-dev bench e2e`'s HAMi figures when HAMi binds only part of the burst before the
deadline: the rate over the window, and a lower bound of rocshare's lead that holds whatever HAMi
would have done after it."""

from __future__ import annotations

from rocshare_dev.bench.burst import BurstResult
from rocshare_dev.bench.e2e import _unfinished_hami_ratios


def burst(*, pods: int, bound: int, elapsed_s: float, all_bound_s: float | None) -> BurstResult:
    return BurstResult(pods=pods, running=0, failed={}, create_s=1.0, all_running_s=None, elapsed_s=elapsed_s,
                       bound=bound, all_bound_s=all_bound_s)


def test_an_unfinished_hami_burst_gives_the_window_ratio_and_a_lower_bound() -> None:
    hami = burst(pods=2000, bound=720, elapsed_s=180.0, all_bound_s=None)
    ours = burst(pods=2000, bound=2000, elapsed_s=100.0, all_bound_s=100.0)
    figures = _unfinished_hami_ratios(hami, ours, partial=720 / 180.0)
    assert figures["e2e_rocshare_to_hami_partial_bound_ratio"] == 5.0  # 20 / 4 pods/s
    assert figures["e2e_rocshare_to_hami_bound_ratio_at_least"] == 1.8  # 20 / (2000 / 180)
    assert "720 of 2000" in figures["e2e_hami_unfinished_note"]


def test_a_finished_hami_burst_needs_no_bound() -> None:
    hami = burst(pods=2000, bound=2000, elapsed_s=150.0, all_bound_s=150.0)
    ours = burst(pods=2000, bound=2000, elapsed_s=100.0, all_bound_s=100.0)
    assert _unfinished_hami_ratios(hami, ours, partial=2000 / 150.0) == {}


def test_every_bench_all_section_has_a_report_title():
    """`bench all` renders each section under a title; a section without one crashed the report."""
    from rocshare_dev.bench import all as bench_all

    for name in bench_all.SECTIONS:
        assert bench_all._section_lines(name, {"skipped": True})[0].startswith("## "), name
