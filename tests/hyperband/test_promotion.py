from __future__ import annotations

import math

import pytest

from prefect_hyperband.hyperband.promotion import best, best_rung, n_promoted, promote, rank


def test_top_k_maximise_and_minimise_are_mirror_images():
    scores = {"a": 0.7, "b": 0.9, "c": 0.8, "d": 0.6}
    assert promote(scores, 2, "max") == ["b", "c"]
    assert promote(scores, 2, "min") == ["d", "a"]


def test_ties_broken_by_id_whatever_the_insertion_order():
    assert promote({"t2": 0.5, "t1": 0.5, "t3": 0.1}, 1, "max") == ["t1"]
    assert promote({"t1": 0.5, "t2": 0.5, "t3": 0.1}, 1, "max") == ["t1"]


def test_failed_trials_rank_last_and_are_never_promoted():
    scores = {"a": None, "b": 0.2, "c": math.nan, "d": 0.1}
    assert rank(scores, "max") == ["b", "d", "a", "c"]
    assert promote(scores, 3, "max") == ["b", "d"]
    assert best({"a": None}, "max") is None


def test_caller_mapping_is_not_modified():
    scores = {"b": 1.0, "a": 2.0}
    promote(scores, 1, "max")
    assert list(scores) == ["b", "a"]


def test_n_promoted_is_floor_n_over_eta():
    assert [n_promoted(n, 3) for n in (81, 34, 11, 3, 2)] == [27, 11, 3, 1, 0]


def test_bad_direction_is_rejected():
    with pytest.raises(ValueError, match="direction must be 'max' or 'min'"):
        promote({"a": 1.0}, 1, "up")  # type: ignore[arg-type]


def test_a_trials_best_rung_is_ranked_as_the_jobs_best_in_either_direction_ties_to_the_smaller_resource():
    scores = {1: 0.5, 3: 0.7, 9: 0.6, 27: None, 81: float("nan")}
    assert best_rung("t", scores, "max") == (3, 0.7)
    assert best_rung("t", scores, "min") == (1, 0.5)
    assert best_rung("t", {1: 0.5, 3: 0.5}, "max") == (1, 0.5)
    assert best_rung("t", {1: (0.5, 9.0), 3: (0.4, 1.0)}, ("min", "min")) == (3, 0.4)  # several: by the first
    assert best_rung("t", {1: None}, "max") is None and best_rung("t", {}, "min") is None
