"""A job that ends when its goal is met (``hyperband.criteria``): no new trial-rung once a criterion holds."""

from __future__ import annotations

from prefect_hyperband.hyperband.criteria import Criteria, Goal


def run(goal, scores, jobs=None):
    """Hand out and report one trial-rung at a time as the loop does (``executors.loop``: the goal asked before each,
    told each result); the (trial, resource) pairs trained."""
    trained = []
    for t, r in JOBS if jobs is None else jobs:
        if goal.met():
            break
        trained.append((t, r))
        goal.see(t, r, scores[t, r])
    return trained


JOBS = [("a", 1), ("b", 1), ("a", 9), ("c", 1), ("b", 9), ("d", 9), ("e", 9), ("f", 9)]
SCORES = {("a", 1): 0.7, ("b", 1): 0.95, ("a", 9): 0.8, ("c", 1): 0.6, ("b", 9): 0.9, ("d", 9): 0.85,
          ("e", 9): None, ("f", 9): 0.99}


def test_without_criteria_the_schedule_runs_to_its_end():
    s = Goal(Criteria(), "max", 9)
    assert run(s, SCORES) == JOBS and s.reason is None and not s.met()


def test_a_target_score_counts_at_r_by_default_and_at_the_resource_asked():
    s = Goal(Criteria(target_score=0.9), "max", 9)
    assert run(s, SCORES) == JOBS[:5]  # 0.95 at r=1 does not count; 0.9 at R does
    assert s.reason == "target score 0.9 reached: score 0.9 by trial b at r=9" and s.met()
    low = Goal(Criteria(target_score=0.9, target_resource=1), "max", 9)
    assert run(low, SCORES) == JOBS[:2]


def test_a_target_score_for_a_metric_better_smaller():
    losses = {k: (None if v is None else 1 - v) for k, v in SCORES.items()}
    s = Goal(Criteria(target_score=0.12), "min", 9, metric="val_loss")
    assert run(s, losses) == JOBS[:5] and s.reason.startswith("target score 0.12 reached: val_loss 0.1 by trial b")


def test_patience_counts_results_at_r_in_a_row_without_a_new_best_failures_included():
    s = Goal(Criteria(patience=3), "max", 9)
    # at R: a 0.8 (best), b 0.9 (best), d 0.85 (1), e failed (2), f 0.99 ... stops before f at patience 2
    assert run(Goal(Criteria(patience=2), "max", 9), SCORES) == JOBS[:7]
    assert run(s, SCORES) == JOBS and s.reason is None  # f at R is the third, and a new best


def test_cost_and_time_are_checked_before_each_new_trial_rung():
    spent = iter([0.0, 5.0, 10.0, 99.0])
    s = Goal(Criteria(max_cost=10.0), "max", 9, cost=lambda: next(spent))
    assert run(s, SCORES) == JOBS[:2] and s.reason == "max cost: 10.0 of 10.0 worker-seconds spent"
    t = Goal(Criteria(time_budget=60.0), "max", 9, clock=lambda: 61.0)
    assert run(t, SCORES) == [] and t.reason.startswith("time budget: 61.0 of 60.0 s")


def test_a_resumed_job_counts_its_rows_again_and_a_looser_criterion_goes_on():
    rows = [{"trial_id": t, "resource": r, "score": SCORES[t, r]} for t, r in JOBS[:7]]
    again = Goal(Criteria(patience=2), "max", 9, rows=rows)
    assert again.met() and again.reason.startswith("patience: 2 results at R=9")
    looser = Goal(Criteria(patience=5), "max", 9, rows=rows)
    assert run(looser, SCORES, JOBS[7:]) == JOBS[7:] and looser.reason is None


def test_the_baseline_is_no_result_of_the_search_and_meets_no_goal():
    s = Goal(Criteria(target_score=0.9, patience=1), "max", 9, rows=[{"trial_id": "default", "resource": 9, "score": 0.99}])
    s.see("default", 9, 0.95)
    assert not s.met() and s.since_best == 0 and s.best_at_r is None
