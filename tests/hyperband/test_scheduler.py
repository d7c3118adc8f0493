"""One scheduler interface: synchronous Hyperband and ASHA driven by the same loop, with literal scores."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.first import PRIOR_BRACKET, PRIOR_TRIAL, Firsts
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, Decision, HyperbandScheduler, TrialRecord, best_of
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.hyperband.trial import TrialRung, ended

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def score(config, resource):
    """Lower is better; a learning curve that improves with resource."""
    return config["x"] + 1.0 / resource


def run(scheduler, concurrency=2, stop_after=None):
    """The driver's loop, in plain Python: returns every job handed out."""
    jobs, flying = [], []
    while True:
        while len(flying) < concurrency:
            job = scheduler.next_trial_rung()
            if job is None:
                break
            jobs.append(job)
            flying.append(job)
        if not flying or (stop_after is not None and len(jobs) >= stop_after):
            return jobs
        job = flying.pop(0)
        scheduler.report(job.trial_id, job.resource, score(job.config, job.resource), f"ck/{job.trial_id}/{job.resource}")


def test_hyperband_81_3_hands_out_table_1_and_resumes_every_promotion():
    sched = HyperbandScheduler(1, 81, 3, "min", SPACE, seed=0)
    jobs = run(sched)
    assert sched.done and sched.finish() == []
    assert len(jobs) == 206 and len({j.trial_id for j in jobs}) == 143
    per_rung = Counter((j.bracket, j.resource) for j in jobs)
    assert [per_rung[(4, r)] for r in (1, 3, 9, 27, 81)] == [81, 27, 9, 3, 1]
    assert [per_rung[(0, 81)]] == [5]
    for j in jobs:  # a promoted trial continues from the checkpoint of its previous rung, never from scratch
        assert (j.checkpoint is None) == (j.rung == 0)
        if j.checkpoint:
            assert j.checkpoint.startswith(f"ck/{j.trial_id}/")
    statuses = Counter(t.status for t in sched.records())
    assert statuses == {"stopped": 143 - 10, "completed": 10}


def test_hyperband_state_round_trips_mid_run_and_reoffers_in_flight_jobs():
    whole = HyperbandScheduler(1, 27, 3, "min", SPACE, seed=4)
    run(whole)
    cut = HyperbandScheduler(1, 27, 3, "min", SPACE, seed=4)
    first = run(cut, stop_after=30)
    in_flight = {j.trial_id for j in first} & cut.in_flight
    assert in_flight
    again = HyperbandScheduler.from_json(json.loads(json.dumps(cut.to_json())), SPACE, None)
    rest = run(again)
    assert in_flight <= {j.trial_id for j in rest}
    assert best_of(again.records(), "min")[1:] == best_of(whole.records(), "min")[1:]
    assert [t.scores for t in again.records()] == [t.scores for t in whole.records()]


def test_sequential_brackets_start_one_after_another_with_configs_asked_then():
    asked = []

    class Recording(RandomSampler):
        def ask(self):
            asked.append(len(asked))
            return super().ask()

        def tell(self, config, resource, value):
            told.append(resource)

    told: list[int] = []
    sched = HyperbandScheduler(1, 9, 3, "min", SPACE, seed=0, sampler=Recording(SPACE, 0), sequential=True)
    first = sched.next_trial_rung()
    assert first.bracket == 2 and len(asked) == 9  # only bracket s=2 has sampled
    sched.report(first.trial_id, first.resource, score(first.config, 1), "ck")
    jobs = [first] + run(sched, concurrency=50)
    order = [j.bracket for j in jobs]
    assert order == sorted(order, reverse=True)  # no job of s=1 before s=2 is done
    assert len(asked) == 9 + 5 + 3 and len(told) == 22


def test_a_failed_trial_ends_at_its_report_and_is_never_promoted():
    sched = HyperbandScheduler(1, 3, 3, "min", SPACE, seed=0)
    jobs = [sched.next_trial_rung() for _ in range(3)]
    assert [j.bracket for j in jobs] == [1, 1, 1]
    assert sched.report(jobs[0].trial_id, 1, None, None, "boom") == [Decision("failed", 1, 0, 1, jobs[0].trial_id, 2)]
    assert sched.report(jobs[1].trial_id, 1, 0.9, "ck") == []  # the rung still waits for jobs[2]
    closing = sched.report(jobs[2].trial_id, 1, 0.1, "ck")  # the last result closes the rung: the barrier is the scheduler's
    assert closing == [
        Decision("promoted", 1, 0, 1, jobs[2].trial_id, 2),
        Decision("stopped", 1, 0, 1, jobs[1].trial_id, 2),
        Decision("rung_closed", 1, 0, 1, None, 2),
    ]
    assert ended(closing) == [jobs[1].trial_id]
    with pytest.raises(ValueError, match="report each once"):
        sched.report(jobs[1].trial_id, 1, 0.5, "ck")


def test_asha_scheduler_stops_at_max_trials_and_resumes_its_backlog():
    clock = lambda: 0.0  # noqa: E731
    sched = AshaScheduler(AshaState.create(1, 9, 3, "min"), RandomSampler(SPACE, 1), max_trials=20, clock=clock)
    jobs = run(sched, concurrency=3, stop_after=12)
    saved = json.loads(json.dumps(sched.to_json()))
    resumed = AshaScheduler(AshaState.from_json(saved["state"]), RandomSampler.from_json(SPACE, saved["sampler"]),
                            saved["max_trials"], saved["time_budget"], clock)
    assert resumed.backlog and set(resumed.backlog) <= {j.trial_id for j in jobs}
    run(resumed, concurrency=3)
    assert resumed.done and resumed.state.configs_started == 20
    stopped = resumed.finish()
    assert {d.kind for d in stopped} <= {"stopped"} and len(ended(stopped)) == len(stopped)
    assert all(t.status in ("stopped", "completed") for t in resumed.records())


def test_asha_time_budget_reads_the_clock_passed_in():
    now = {"t": 0.0}
    sched = AshaScheduler(AshaState.create(1, 9, 3, "min"), RandomSampler(SPACE, 1), max_trials=1000,
                          time_budget=10.0, clock=lambda: now["t"])
    assert sched.next_trial_rung() is not None
    now["t"] = 11.0
    assert sched.next_trial_rung() is None or sched.state.configs_started == 1


def test_best_of_ranks_with_the_promotion_key():
    records = [
        TrialRecord("s0-0001", 0, {}, "completed", 0, 9, {9: 0.5}),
        TrialRecord("s0-0000", 0, {}, "completed", 0, 9, {9: 0.5, 3: None}),
        TrialRecord("s1-0000", 1, {}, "failed", 0, 0, {1: None}),
    ]
    assert best_of(records, "min")[0].trial_id == "s0-0000"
    assert best_of(records, "max")[0].trial_id == "s0-0000"
    assert best_of(records[2:], "max") is None


# --------------------------------------------------------------------------------- the prior first

PRIORS = parse({"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.0, "confidence": "high"}})


def prior_first(mode="hyperband"):
    sampler = PriorBandSampler(PRIORS, 0, "min", 1, 9, 3)
    inner = (HyperbandScheduler(1, 9, 3, "min", PRIORS, seed=0, sampler=sampler, sequential=True) if mode == "hyperband"
             else AshaScheduler(AshaState.create(1, 9, 3, "min"), sampler, max_trials=10))
    inner.first = Firsts.of(None, priors.mode(PRIORS), 9)
    return inner, sampler


@pytest.mark.parametrize("mode", ["hyperband", "asha"])
def test_the_priors_mode_trains_to_r_first_beside_the_schedule_and_is_not_told_to_the_sampler(mode):
    sched, sampler = prior_first(mode)
    jobs = run(sched, concurrency=2)
    assert jobs[0] == TrialRung(PRIOR_TRIAL, PRIOR_BRACKET, 0, 9, {"x": 0.0}, None)
    assert jobs[1].trial_id != PRIOR_TRIAL and jobs[1].resource == 1  # the second slot starts the schedule meanwhile
    assert sum(j.trial_id == PRIOR_TRIAL for j in jobs) == 1 and sched.done
    prior = [t for t in sched.records() if t.trial_id == PRIOR_TRIAL]
    assert prior == [TrialRecord(PRIOR_TRIAL, PRIOR_BRACKET, {"x": 0.0}, "completed", 0, 9,
                                 {9: pytest.approx(1 / 9)}, None)]
    assert best_of(sched.records(), "min")[0].trial_id == PRIOR_TRIAL  # x = 0 at R: the best the job can find
    told = [c for obs in sampler.observations.values() for c, _ in obs]
    assert {"x": 0.0} not in told and len(told) == len(jobs) - 1  # as NePS: the prior's result is not the sampler's


def test_the_prior_first_is_offered_again_after_a_kill_and_never_twice():
    sched, _ = prior_first()
    first = sched.next_trial_rung()
    assert first.trial_id == PRIOR_TRIAL
    saved = json.loads(json.dumps(sched.to_json()))  # killed while it trains
    again = HyperbandScheduler.from_json(saved, PRIORS, None)
    assert again.next_trial_rung() == first
    decisions = again.report(PRIOR_TRIAL, 9, 0.3, "ck/prior/9")
    assert decisions == [Decision("completed", PRIOR_BRACKET, 0, 9, PRIOR_TRIAL, 1)]
    saved = json.loads(json.dumps(again.to_json()))
    resumed = HyperbandScheduler.from_json(saved, PRIORS, None)
    assert resumed.next_trial_rung().trial_id != PRIOR_TRIAL
    assert [t.scores for t in resumed.records() if t.trial_id == PRIOR_TRIAL] == [{9: 0.3}]
    with pytest.raises(ValueError, match="report each once"):
        resumed.report(PRIOR_TRIAL, 9, 0.3, "ck/prior/9")


def test_a_failed_prior_first_is_recorded_and_the_job_goes_on():
    sched, _ = prior_first()
    assert sched.next_trial_rung().trial_id == PRIOR_TRIAL
    assert sched.report(PRIOR_TRIAL, 9, None, None, "boom") == [Decision("failed", PRIOR_BRACKET, 0, 9, PRIOR_TRIAL, 1)]
    jobs = run(sched)
    assert jobs and sched.done
    prior = next(t for t in sched.records() if t.trial_id == PRIOR_TRIAL)
    assert (prior.status, prior.scores, prior.error, prior.resource) == ("failed", {9: None}, "boom", 0)
