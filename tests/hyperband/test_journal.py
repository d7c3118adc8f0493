"""A snapshot plus the calls made since is the scheduler at its last call: every scheduler, mid-run, trial-rungs in flight
across the snapshot, failures, and ASHA's promotions found without ranking every rung."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.first import Firsts
from prefect_hyperband.hyperband.journal import Diverged, Journal, replay
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler
from prefect_hyperband.hyperband.space import parse

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "int", "low": 1, "high": 50}})
PRIORS = parse({"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.2, "confidence": "high"},
                "y": {"type": "int", "low": 1, "high": 50}})


def outcome(trial_id: str, resource: int) -> float | None:
    """The same score for the same trial-rung in every run; about one in twenty fails."""
    h = zlib.crc32(f"{trial_id}@{resource}".encode())
    return None if h % 20 == 0 else (h % 10_000) / 10_000 + 1.0 / resource


class Run:
    """The loop in plain Python: ``width`` trial-rungs in flight, results told in a seeded, shuffled order, each
    call written in ``journal`` as the loop writes it."""

    def __init__(self, scheduler, width: int = 4, seed: int = 0, journal: Journal | None = None) -> None:
        self.scheduler, self.width, self.rng, self.flying = scheduler, width, np.random.default_rng(seed), []
        self.journal = journal or Journal()

    def steps(self, n: int) -> bool:
        for _ in range(n):
            while len(self.flying) < self.width and (job := self.scheduler.next_trial_rung()) is not None:
                self.flying.append(job)
                self.journal.handed(job)
            if not self.flying:
                return False
            job = self.flying.pop(int(self.rng.integers(len(self.flying))))
            value = outcome(job.trial_id, job.resource)
            error, checkpoint = None if value is not None else "boom", f"ck/{job.trial_id}/{job.resource}"
            self.scheduler.report(job.trial_id, job.resource, value, checkpoint, error)
            self.journal.reported(job.trial_id, job.resource, value, checkpoint, error)
        return True


def hyperband(sampler_kind: str):
    if sampler_kind == "random":
        return HyperbandScheduler(1, 27, 3, "min", SPACE, seed=5)
    sampler = TPESampler(SPACE, 5, "min") if sampler_kind == "tpe" else PriorBandSampler(PRIORS, 5, "min", 1, 27, 3)
    return HyperbandScheduler(1, 27, 3, "min", PRIORS if sampler_kind == "priorband" else SPACE, seed=5,
                              sampler=sampler, sequential=True)


def asha(max_trials: int = 60):
    return AshaScheduler(AshaState.create(1, 27, 3, "min"), RandomSampler(SPACE, 5), max_trials=max_trials)


KINDS = {
    "hyperband": lambda: hyperband("random"),
    "hyperband-tpe": lambda: hyperband("tpe"),
    "priorband": lambda: hyperband("priorband"),
    "asha": asha,
    "prior-first-asha": lambda: first(asha(), None, priors.mode(PRIORS)),
    "baseline-hyperband-tpe": lambda: first(hyperband("tpe"), {"x": 0.5, "y": 25}, None),
    "baseline-prior-first-asha": lambda: first(asha(), {"x": 0.5, "y": 25}, priors.mode(PRIORS)),
}


def first(scheduler, baseline, prior):
    """``scheduler`` with the default config and the priors' mode first (``hyperband.first``)."""
    scheduler.first = Firsts.of(baseline, prior, 27)
    return scheduler


def load(raw: dict, requeue: bool):
    """As ``executors.schedulers.make_scheduler`` loads a saved scheduler."""
    if raw["kind"] == "asha":
        return AshaScheduler(AshaState.from_json(raw["state"]), RandomSampler.from_json(SPACE, raw["sampler"]),
                             raw["max_trials"], raw["time_budget"], first=Firsts.from_json(raw, requeue),
                             requeued=requeue)
    else:
        sampler = None
        if raw.get("sampler"):
            kind = raw["sampler"]["kind"]
            sampler = (TPESampler.from_json(SPACE, raw["sampler"]) if kind == "tpe"
                       else PriorBandSampler.from_json(PRIORS, raw["sampler"]))
        space = PRIORS if raw.get("sampler") and raw["sampler"]["kind"] == "priorband" else SPACE
        return HyperbandScheduler.from_json(raw, space, sampler, requeue=requeue)


def roundtrip(raw: dict) -> dict:
    return json.loads(json.dumps(raw))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cut", [7, 40])
def test_a_snapshot_and_the_calls_since_replay_to_the_same_scheduler(kind, cut):
    original, journal = KINDS[kind](), Journal()
    run = Run(original, journal=journal)
    run.steps(cut)
    snapshot = roundtrip(original.to_json())  # jobs are in flight now: their results come after it
    journal.take()
    run.steps(25)
    calls = roundtrip(journal.take())
    flying = set(snapshot_in_flight(snapshot))
    assert flying or cut != 7  # early on, every scheduler has trial-rungs in flight at the snapshot
    assert all(any(c[0] == "report" and c[1] == t for c in calls) for t in flying)  # told after it

    loaded = load(snapshot, requeue=False)
    assert replay(loaded, calls) == len(calls)
    assert roundtrip(loaded.to_json()) == roundtrip(original.to_json())

    # requeued, the replayed scheduler finishes the job as the original does
    loaded.requeue()
    resumed = load(roundtrip(original.to_json()), requeue=True)
    Run(loaded, width=1).steps(10_000)
    Run(resumed, width=1).steps(10_000)
    assert [(t.trial_id, t.scores, t.status) for t in loaded.records()] == \
        [(t.trial_id, t.scores, t.status) for t in resumed.records()]


def snapshot_in_flight(raw: dict) -> list[str]:
    if raw["kind"] == "asha":
        return [t for t, v in raw["state"]["trials"].items() if v["in_flight"]]
    return list(raw.get("in_flight", []))


def test_a_replay_ignores_asha_stopping_rules_that_a_resume_tightened():
    original, journal = asha(max_trials=40), Journal()
    Run(original, journal=journal).steps(30)
    snapshot = roundtrip(original.to_json())
    journal.take()
    Run(original, journal=journal).steps(30)
    calls = journal.take()
    tighter = {**snapshot, "max_trials": 1, "time_budget": 0.0}
    loaded = load(tighter, requeue=False)
    assert replay(loaded, calls) == len(calls)
    assert loaded.state.to_json() == original.state.to_json()
    assert loaded.bounded  # the rules hold again for what comes next
    loaded.requeue()
    started = loaded.state.configs_started
    Run(loaded).steps(1000)
    assert loaded.state.configs_started == started  # what was in flight or promotable ran; no new config


def test_a_journal_of_another_state_diverges_with_the_call_named():
    original, journal = asha(), Journal()
    Run(original, journal=journal).steps(10)
    calls = journal.take()
    other = AshaScheduler(AshaState.create(1, 27, 3, "min"), RandomSampler(SPACE, 99), max_trials=60)
    Run(other).steps(3)
    with pytest.raises(Diverged, match="the journal handed out s3-0000"):
        replay(other, calls)


@pytest.mark.parametrize("seed", range(6))
def test_asha_next_promotion_is_the_first_promotable_at_every_step(seed):
    """The O(log n) promotion check against the paper's rule computed by ranking every rung (``promotable``)."""
    state = AshaState.create(1, 81, 3, "max")
    rng = np.random.default_rng(seed)
    flying = []
    for step in range(600):
        assert state.next_promotion() == (state.promotable() or [None])[0]
        while len(flying) < 5:
            job = state.next_trial_rung(lambda: {"x": float(rng.random())}, can_start_new=step < 450)
            if job is None:
                break
            flying.append(job)
        if not flying:
            break
        job = flying.pop(int(rng.integers(len(flying))))
        value = None if rng.random() < 0.05 else float(rng.integers(0, 50))  # ties are common: ids break them
        state.report(job.trial_id, job.resource, value, f"ck/{job.trial_id}")
    loaded = AshaState.from_json(roundtrip(state.to_json()))  # the index is rebuilt from the saved rungs
    assert loaded.next_promotion() == state.next_promotion()
