"""The baseline (the default config trained to R) as the scheduler hands it out: first, apart from the search,
saved with the scheduler and handed out again only when it was in flight."""

from __future__ import annotations

import json

import pytest

from prefect_hyperband.hyperband.first import BASELINE_BRACKET, BASELINE_TRIAL, Firsts, FirstTrial
from prefect_hyperband.hyperband.scheduler import HyperbandScheduler
from prefect_hyperband.hyperband.space import parse

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def wrapped() -> HyperbandScheduler:
    return HyperbandScheduler(1, 9, 3, "min", SPACE, seed=0, first=Firsts.of({"x": 0.5}, None, 9))


def baseline(sched: HyperbandScheduler) -> FirstTrial:
    return sched.first.find(BASELINE_TRIAL)


def test_handed_out_first_at_r_then_the_schedule():
    sched = wrapped()
    first, second = sched.next_trial_rung(), sched.next_trial_rung()
    assert (first.trial_id, first.bracket, first.rung, first.resource, first.config, first.checkpoint) == \
        (BASELINE_TRIAL, BASELINE_BRACKET, 0, 9, {"x": 0.5}, None)
    assert second.trial_id != BASELINE_TRIAL and second.bracket >= 0
    assert not sched.done


def test_its_result_decides_nothing_and_is_no_record_of_the_search():
    sched = wrapped()
    sched.next_trial_rung()
    assert baseline(sched).score is None
    assert sched.report(BASELINE_TRIAL, 9, 0.42, "ck/default/9") == []
    assert baseline(sched).status == "completed" and baseline(sched).score == 0.42
    assert all(t.trial_id != BASELINE_TRIAL for t in sched.records())
    with pytest.raises(ValueError, match="report each once"):
        sched.report(BASELINE_TRIAL, 9, 0.42, "ck/default/9")


def test_failed_it_has_no_score_and_the_job_is_done_when_the_schedule_is():
    sched = wrapped()
    flying = []
    while (t := sched.next_trial_rung()) is not None or flying:
        if t is not None:
            flying.append(t)
            continue
        t = flying.pop(0)
        if t.trial_id == BASELINE_TRIAL:
            sched.report(t.trial_id, t.resource, None, None, "ValueError: no default")
        else:
            sched.report(t.trial_id, t.resource, t.config["x"], f"ck/{t.trial_id}/{t.resource}")
    lost = baseline(sched)
    assert sched.done and lost.status == "failed" and lost.score is None and lost.error.startswith("ValueError")
    assert sched.finish() == []


def test_saved_with_the_scheduler_and_handed_out_again_only_when_it_was_in_flight():
    sched = wrapped()
    sched.next_trial_rung()
    raw = json.loads(json.dumps(sched.to_json()))
    inner = lambda: HyperbandScheduler.from_json(raw, SPACE, None)  # noqa: E731
    again = inner()
    assert again.next_trial_rung().trial_id == BASELINE_TRIAL  # in flight when saved: trained again
    sched.report(BASELINE_TRIAL, 9, 0.42, "ck/default/9")
    raw = json.loads(json.dumps(sched.to_json()))
    done = inner()
    assert baseline(done).status == "completed" and baseline(done).score == 0.42
    assert done.next_trial_rung().trial_id != BASELINE_TRIAL  # kept: not trained again
    in_flight = wrapped()
    in_flight.next_trial_rung()
    with pytest.raises(ValueError, match="in flight"):
        in_flight.finish()
