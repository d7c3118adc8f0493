from __future__ import annotations

import pytest

from prefect_hyperband.hyperband.accounting import RungResult, longest_idle, summarise, table


def test_summary_counts_units_and_worker_seconds():
    rows = [
        RungResult("a", 1, 0, 3, 3, 3.0, 0.1, 2, 0.7),
        RungResult("b", 1, 0, 3, 3, 3.0, 0.1, 2, 0.8),
        RungResult("b", 1, 1, 9, 6, 6.0, 0.1, 2, 0.9),
    ]
    s = summarise(rows, metric="auc", configs=2, max_resource=9, reached_max_resource=1, failed_trials=0,
                  best=("b", 9, 0.9), default_score=0.75, wall_seconds=8.0)
    assert s.resource_used == 12
    assert s.resource_without_early_stopping == 18
    assert s.worker_seconds == pytest.approx(24.3)
    # 1 worker-second per unit (24 / 12) times 18 units, plus 2 evaluations at 0.1 s
    assert s.worker_seconds_without_early_stopping == pytest.approx(36.2)
    assert s.sequential_seconds == pytest.approx(12.3)
    # wall baseline: the estimate of every config to R, at the job's concurrency (1 here), labelled est.
    assert s.wall_seconds_without_early_stopping == pytest.approx(36.2)
    text = table(s)
    assert "0.7500 default config" in text and "0.9000 tuned" in text
    assert "1.5x fewer" in text and "4.5x faster" in text
    assert "every config to R, 1 at once (est.)" in text and "same trials one after another" not in text


def test_wall_baseline_divides_by_the_concurrency():
    rows = [RungResult("a", 0, 0, 9, 9, 9.0, 0.0, 1, 0.5)]
    s = summarise(rows, metric="auc", configs=4, max_resource=9, reached_max_resource=1, failed_trials=0,
                  best=("a", 9, 0.5), default_score=None, wall_seconds=10.0, concurrency=2)
    assert s.worker_seconds_without_early_stopping == pytest.approx(36.0)
    assert s.wall_seconds_without_early_stopping == pytest.approx(18.0)


def test_longest_idle_is_the_largest_hole_in_the_union_of_trial_rungs():
    def row(started, ended):
        return RungResult("t", 0, 0, 1, 1, ended - started, 0.0, 1, 0.5, started=started, ended=ended)

    # two slots: [0, 4] and [1, 2] overlap; idle 4 -> 6; [6, 7]; idle 7 -> 7.5; [7.5, 9]
    rows = [row(0, 4), row(1, 2), row(6, 7), row(7.5, 9)]
    assert longest_idle(rows) == pytest.approx(2.0)
    assert longest_idle([]) == 0.0 and longest_idle([row(0, 1)]) == 0.0
    unstamped = RungResult("t", 0, 0, 1, 1, 1.0, 0.0, 1, 0.5)
    assert longest_idle([unstamped, row(0, 1), row(5, 6)]) == pytest.approx(4.0)


def test_lost_work_is_part_of_the_cost_and_said_in_the_footer():
    from prefect_hyperband.hyperband.accounting import RungResult, summarise, table

    rows = [RungResult(trial_id="s0-0000", bracket=0, rung=0, resource=3, resource_trained=3, train_seconds=2.0,
                      eval_seconds=0.5, workers=2, score=0.1)]
    s = summarise(rows, metric="loss", configs=1, max_resource=3, reached_max_resource=1, failed_trials=0,
                  best=("s0-0000", 3, 0.1), default_score=None, wall_seconds=5.0, lost_worker_seconds=7.0)
    assert s.worker_seconds == 2.0 * 2 + 0.5 + 7.0 and s.lost_worker_seconds == 7.0
    assert "7.0 worker-s lost" in table(s)


def test_the_baseline_s_training_is_part_of_both_costs_and_said_in_the_footer():
    rows = [RungResult("s0-0000", 0, 0, 9, 9, 9.0, 0.0, 1, 0.5)]
    baseline = RungResult("default", -2, 0, 9, 9, 4.0, 0.5, 2, 0.6)
    s = summarise(rows, metric="loss", configs=2, max_resource=9, reached_max_resource=1, failed_trials=0,
                  best=("s0-0000", 9, 0.5), default_score=0.6, wall_seconds=20.0, baseline=baseline)
    assert s.baseline_worker_seconds == 4.0 * 2 + 0.5
    assert s.worker_seconds == 9.0 + 8.5  # what the job spent, the default config's training included
    assert s.worker_seconds_without_early_stopping == pytest.approx(18.0 + 8.5)  # either job trains it
    assert s.trial_rungs == 1 and s.resource_used == 9  # the search's figures are the search's
    assert "the default config's training 8.5 worker-s, in both costs" in table(s)
