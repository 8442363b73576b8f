"""normalize_scores keeps the policy's best node alone at the top of the extender's 0-10 scale,
so kube-scheduler (whose own scores only break the extender's ties, see the scheduler profile)
picks the node the policy ranks first, not one of several that round to 10."""

from __future__ import annotations

from rocshare.core.policies import normalize_scores


def test_only_the_best_raw_score_gets_ten() -> None:
    scores = normalize_scores({"best": 100.0, "close": 99.99, "low": 0.0})
    assert scores == {"best": 10, "close": 9, "low": 0}


def test_exactly_equal_best_scores_share_the_top() -> None:
    assert normalize_scores({"a": 5.0, "b": 5.0, "c": 1.0}) == {"a": 10, "b": 10, "c": 0}


def test_scale_otherwise_unchanged() -> None:
    assert normalize_scores({"a": 1.0, "b": 3.0, "c": 2.0}) == {"a": 0, "b": 10, "c": 5}
    assert normalize_scores({"a": 1.0, "b": 1.0}) == {"a": 0, "b": 0}
    assert normalize_scores({}) == {}
