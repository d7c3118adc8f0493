"""Several objectives: fronts, crowding and promotion held against results worked out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from prefect_hyperband.hyperband import pareto
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.hyperband.promotion import promote, rank, sort_key
from prefect_hyperband.hyperband.schedule import brackets
from prefect_hyperband.hyperband.space import parse

# A rung of 9 trials, (val_auc: max, predict_ms: min). By hand:
#   front 0: a (.90, 5), b (.85, 2), c (.80, 1), f (.88, 4)  (none beats another)
#   front 1: d (.90, 6) (beaten by a only), i (.80, 2) (beaten by c: same AUC, faster)
#   front 2: e (.70, 3) (beaten by i);  front 3: g (.60, 6);  h failed
# crowding in front 0, AUC over its range .10:  c inf, b (.88-.80)/.1 = .8, f (.90-.85)/.1 = .5, a inf;
#                        ms over its range 4:   a inf, f (5-2)/4 = .75, b (4-1)/4 = .75, c inf
#   -> a inf, c inf, b 1.55, f 1.25: ⌊9/3⌋ = 3 go up: a, c, b (f is the one of front 0 left out)
TWO = {
    "a": (0.90, 5.0), "b": (0.85, 2.0), "c": (0.80, 1.0), "d": (0.90, 6.0), "e": (0.70, 3.0),
    "f": (0.88, 4.0), "g": (0.60, 6.0), "h": None, "i": (0.80, 2.0),
}
TWO_DIRECTIONS = ("max", "min")

# 7 trials, (max, min, max); as "larger is better" points: p (3,0,0), q (0,3,0), r (0,0,3), s (1,1,1),
# t (1,1,0) beaten by s, v (2,0,0) beaten by p, u failed. Front 0 = p q r s: every axis has two extremes,
# so p, q and r are all infinitely far from their neighbours and s is at 1 + 1 + 1 = 3: a three-way tie
# for ⌊7/3⌋ = 2 places, broken by id -> p, q.
THREE = {
    "p": (3.0, 0.0, 0.0), "q": (0.0, -3.0, 0.0), "r": (0.0, 0.0, 3.0), "s": (1.0, -1.0, 1.0),
    "t": (1.0, -1.0, 0.0), "u": (float("nan"), 0.0, 1.0), "v": (2.0, 0.0, 0.0),
}
THREE_DIRECTIONS = ("max", "min", "max")


def test_two_objective_fronts_crowding_and_promotion_equal_the_hand_result() -> None:
    assert pareto.fronts(TWO, TWO_DIRECTIONS) == [["a", "b", "c", "f"], ["d", "i"], ["e"], ["g"]]
    distance = pareto.crowding(["a", "b", "c", "f"], TWO, TWO_DIRECTIONS)
    assert distance["a"] == distance["c"] == math.inf
    assert distance["b"] == pytest.approx(1.55) and distance["f"] == pytest.approx(1.25)
    assert rank(TWO, TWO_DIRECTIONS) == ["a", "c", "b", "f", "d", "i", "e", "g", "h"]
    assert promote(TWO, 3, TWO_DIRECTIONS) == ["a", "c", "b"]
    assert promote(TWO, 6, TWO_DIRECTIONS) == ["a", "c", "b", "f", "d", "i"]
    assert pareto.front_ranks(TWO, TWO_DIRECTIONS) == {"a": 0, "b": 0, "c": 0, "f": 0, "d": 1, "i": 1, "e": 2, "g": 3}


def test_three_objective_rung_with_ties_promotes_the_hand_result() -> None:
    assert pareto.fronts(THREE, THREE_DIRECTIONS) == [["p", "q", "r", "s"], ["t", "v"]]
    distance = pareto.crowding(["p", "q", "r", "s"], THREE, THREE_DIRECTIONS)
    assert distance == {"p": math.inf, "q": math.inf, "r": math.inf, "s": pytest.approx(3.0)}
    assert rank(THREE, THREE_DIRECTIONS) == ["p", "q", "r", "s", "t", "v", "u"]
    assert promote(THREE, 2, THREE_DIRECTIONS) == ["p", "q"]
    assert promote(THREE, 7, THREE_DIRECTIONS) == ["p", "q", "r", "s", "t", "v"]  # the failed one never


def test_ranking_ignores_the_order_of_the_results_and_the_scale_of_an_objective() -> None:
    shuffled = dict(reversed(list(TWO.items())))
    assert rank(shuffled, TWO_DIRECTIONS) == rank(TWO, TWO_DIRECTIONS)
    in_seconds = {t: None if v is None else (v[0], v[1] / 1000) for t, v in TWO.items()}  # ms -> s
    assert rank(in_seconds, TWO_DIRECTIONS) == rank(TWO, TWO_DIRECTIONS)


def test_the_best_of_several_objectives_is_the_best_first_objective() -> None:
    best = min(TWO, key=lambda t: sort_key(t, TWO[t], TWO_DIRECTIONS))
    assert best == "a"  # .90, tied with d, by id


def test_hypervolume_two_and_three_objectives() -> None:
    # union of [.5,.9]x[5,10] and [.5,.8]x[1,10] = 2.0 + 2.7 - 1.5
    assert pareto.hypervolume([(0.9, 5.0), (0.8, 1.0)], (0.5, 10.0), ("max", "min")) == pytest.approx(3.2)
    assert pareto.hypervolume([(0.9, 5.0), (0.4, 1.0)], (0.5, 10.0), ("max", "min")) == pytest.approx(2.0)  # past ref
    assert pareto.hypervolume([], (0.5, 10.0), ("max", "min")) == 0.0
    assert pareto.hypervolume([(2, 1, 1), (1, 2, 1)], (0, 0, 0), ("max", "max", "max")) == pytest.approx(3.0)


def test_hypervolume_equals_a_count_of_unit_cells() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        points = [tuple(int(x) for x in rng.integers(1, 6, size=3)) for _ in range(int(rng.integers(1, 7)))]
        cells = sum(
            any(all(c < p for c, p in zip(cell, point)) for point in points)
            for cell in itertools.product(range(6), repeat=3)
        )
        assert pareto.hypervolume(points, (0, 0, 0), ("max", "max", "max")) == pytest.approx(cells)


def test_knee_is_the_point_nearest_the_ideal_point() -> None:
    front = {t: TWO[t] for t in ("a", "b", "c", "f")}
    # scaled to [0, 1]: a (1, 0), b (.5, .75), c (0, 1), f (.8, .25): gaps .5^2+.25^2 = .3125 and .2^2+.75^2
    assert pareto.knee(front, TWO_DIRECTIONS) == "b"


def test_bad_directions_and_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="at least two"):
        pareto.check(["max"])
    with pytest.raises(ValueError, match="'up'"):
        promote({"a": (1.0, 2.0)}, 1, ("max", "up"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 values for 3 objectives"):
        rank({"a": (1.0, 2.0)}, ("max", "min", "max"))


def test_a_synchronous_bracket_promotes_by_fronts_and_round_trips_json() -> None:
    plan = brackets(1, 9, 3)[0]  # s=2: 9 configs at r=1, 3 at 3, 1 at 9
    space = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})
    state = BracketState.start(plan, 3, space, 0, TWO_DIRECTIONS)
    ids = list(state.trials)
    by_letter = dict(zip("abcdefghi", ids))
    for letter, t in by_letter.items():
        state.record(t, 1, TWO[letter], f"ck-{t}")
    again = BracketState.from_json(state.to_json())
    assert again.scores(by_letter["a"])[1] == (0.90, 5.0)  # JSON's list back to a tuple
    assert again.direction == TWO_DIRECTIONS
    assert again.advance() == [by_letter[x] for x in "acb"]


def test_asha_promotes_by_fronts() -> None:
    state = AshaState.create(1, 9, 3, TWO_DIRECTIONS, brackets=(2,))
    space = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})
    rng = np.random.default_rng(0)
    letters = iter("abcdefghi")
    names: dict[str, str] = {}
    jobs = [state.next_trial_rung(lambda: space.sample(rng), True) for _ in range(9)]  # all out before any result
    for job in jobs:
        assert job is not None and job.rung == 0
        names[job.trial_id] = next(letters)
        state.report(job.trial_id, job.resource, TWO[names[job.trial_id]], "ck")
    promoted = [names[state.next_trial_rung(lambda: space.sample(rng), False).trial_id] for _ in range(3)]  # type: ignore[union-attr]
    assert promoted == ["a", "c", "b"]  # ⌊9/3⌋ of rung 0, in the order of the ranking
