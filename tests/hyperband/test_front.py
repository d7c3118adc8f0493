"""The job's front: trials at their highest rung, the champion by --select, the hypervolume curve."""

from __future__ import annotations

import pytest

from prefect_hyperband.hyperband import front
from prefect_hyperband.hyperband.scheduler import TrialRecord

DIRECTIONS = ("max", "min")
NAMES = ["val_auc", "predict_ms"]


def record(trial_id: str, scores: dict[int, tuple[float, float] | None]) -> TrialRecord:
    return TrialRecord(trial_id, 0, {}, "completed", len(scores) - 1, max(scores), dict(scores))


RECORDS = [
    record("a", {1: (0.70, 1.0), 3: (0.90, 5.0)}),  # its r=1 point would be on the front; it counts at r=3
    record("b", {1: (0.85, 2.0)}),
    record("c", {1: (0.80, 1.0)}),
    record("d", {1: (0.60, 3.0)}),  # dominated by b and c
    record("e", {1: (0.75, 1.5), 3: None}),  # failed at its highest rung: not on the front at all
]


def test_each_trial_counts_at_its_highest_rung() -> None:
    points = front.points(RECORDS, DIRECTIONS)
    assert [(p.trial_id, p.resource, p.front) for p in points] == [("a", 3, 0), ("c", 1, 0), ("b", 1, 0), ("d", 1, 1)]


def test_select_first_knee_and_a_constraint() -> None:
    on = [p for p in front.points(RECORDS, DIRECTIONS) if p.front == 0]
    assert front.choose(on, DIRECTIONS, NAMES, ("first",))[0].trial_id == "a"
    # scaled: a (1, 0), b (.5, .75), c (0, 1): b is nearest (1, 1)
    assert front.choose(on, DIRECTIONS, NAMES, ("knee",))[0].trial_id == "b"
    assert front.choose(on, DIRECTIONS, NAMES, ("predict_ms", "<=", 2.0))[0].trial_id == "b"
    assert front.choose(on, DIRECTIONS, NAMES, ("predict_ms", "<", 2.0))[0].trial_id == "c"
    chosen, note = front.choose(on, DIRECTIONS, NAMES, ("predict_ms", "<", 0.5))
    assert chosen.trial_id == "a" and "no config on the front meets predict_ms<0.5" in note


def test_reference_and_hypervolume_curve() -> None:
    ref = front.reference([(0.7, 1.0), (0.9, 5.0)], DIRECTIONS)
    assert ref == pytest.approx((0.68, 5.4))  # the worst of each, 10% of its range beyond
    steps = [("a", (0.7, 1.0)), ("x", None), ("b", (0.8, 3.0)), ("a", (0.9, 4.0))]
    curve = front.hypervolume_curve(steps, DIRECTIONS, ref)
    # a at r=1: .02 x 4.4 = .088; x failed adds nothing; b adds (.8-.7) x (5.4-3) = .24;
    # a at r=3 replaces a's r=1 point: b's .12 x 2.4 = .288 plus a's (.9-.8) x (5.4-4) = .14
    assert curve == pytest.approx([0.088, 0.088, 0.328, 0.428])


def test_the_printed_front_lists_each_config_on_it_best_first_objective_first() -> None:
    text = front.table(front.points(RECORDS, DIRECTIONS), NAMES, DIRECTIONS, "b")
    lines = text.splitlines()
    assert lines[0] == "Pareto front: 3 configs, each at its highest rung (* the champion)"
    assert lines[1].split() == ["trial", "r", "val_auc", "(max)", "predict_ms", "(min)"]
    assert [line.replace("*", "").split()[:2] for line in lines[2:]] == [["a", "3"], ["b", "1"], ["c", "1"]]
    assert lines[3].startswith("*") and "0.85" in lines[3]
