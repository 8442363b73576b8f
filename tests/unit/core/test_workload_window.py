"""WorkloadWindow: the prior alone with nothing seen, fading linearly to the pool's own shapes
at PRIOR_PODS samples; a bounded window; the model rebuilt only every REBUILD_EVERY samples."""

from __future__ import annotations

from rocshare.core.workload import PRIOR_SHAPES, WorkloadWindow

HALF = (0, 1, 500, ())
WHOLE = (0, 1, 1000, ())


def shapes(window: WorkloadWindow) -> dict:
    return {(t.cpu_milli, t.gpus, t.share_milli, t.types): round(t.weight, 3) for t in window.workload().tasks}


def test_nothing_seen_is_the_prior() -> None:
    got = shapes(WorkloadWindow())
    assert set(got) <= set(PRIOR_SHAPES)
    assert got[WHOLE] > got[HALF] > 0


def test_prior_fades_until_enough_pods_are_seen() -> None:
    window = WorkloadWindow(prior_pods=100)
    for _ in range(50):
        window.add(HALF)
    halfway = shapes(window)
    assert halfway[HALF] > 0.5 and WHOLE in halfway  # 50 seen + 0.15 x 50 prior vs 0.55 x 50
    for _ in range(50):
        window.add(HALF)
    assert shapes(window) == {HALF: 1.0}


def test_window_forgets_the_oldest() -> None:
    window = WorkloadWindow(window=10, prior_pods=0)
    for _ in range(10):
        window.add(WHOLE)
    for _ in range(10):
        window.add(HALF)
    assert window.seen == 10
    assert shapes(window) == {HALF: 1.0}


def test_model_is_rebuilt_only_every_few_samples_once_the_prior_is_gone() -> None:
    window = WorkloadWindow(prior_pods=0, rebuild_every=5)
    window.add(HALF)
    first = window.model()
    for _ in range(4):
        window.add(WHOLE)
        assert window.model() is first
    window.add(WHOLE)
    assert window.model() is not first
