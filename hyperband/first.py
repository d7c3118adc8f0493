"""Configs trained straight to R before the schedule: a scheduler's first trials (``Firsts``), handed out first.

Two of them, either or both, in ``HyperbandScheduler`` or ``AshaScheduler`` (``scheduler.Schedule``):

* the prior's (``--prior-first``): the priors' mode (``priors.mode``), a trial of the search. PriorBand evaluated
  the prior first, at the highest fidelity, when it was published (NePS's PriorBand of then defaulted to
  ``sample_default_first`` and ``sample_default_at_target``; NePS today offers it as
  ``sample_prior_first="highest_fidelity"``). As there, the trial stands outside the brackets (bracket
  ``PRIOR_BRACKET``, one rung at R) and its result is not told to the sampler (NePS leaves it out of the table its
  brackets and sampler read); it is in the job's records, its best and its front like any trial.
* the baseline: the model's default config, the summary's baseline (SageMaker's Hyperband post puts "default" beside
  "tuned"). No trial of the search: its result is not in ``records`` (the best, the champion, the front, the
  importances never see it), it decides nothing, it has no MLflow run of its own (the parent run gets its metric
  as ``default_<metric>``) and it meets no goal (``criteria``). Its row is the job's cost like any other
  (``accounting.summarise`` books it apart).

Either is a trial-rung like any other where it runs (a slot, the job's executor, its timeout, a stop, an
orchestration retry): the loop knows nothing of them. With several slots, the schedule's first trial-rungs start
beside it. The job's state keeps it (the baseline's under ``"baseline"``, the prior's under ``"prior_first"``, beside
the schedule's own): a resume hands it out again only when it was in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.hyperband.promotion import Score, as_score, failed
from prefect_hyperband.hyperband.trial import Decision, Status, TrialRecord, TrialRung

#: the trials added before the schedule: their ids and brackets (outside the schedule's 0..s_max)
PRIOR_TRIAL, PRIOR_BRACKET = "prior", -1
BASELINE_TRIAL, BASELINE_BRACKET = "default", -2
#: each one's key in the saved scheduler, by trial id
KEYS = {BASELINE_TRIAL: "baseline", PRIOR_TRIAL: "prior_first"}
BRACKETS = {BASELINE_TRIAL: BASELINE_BRACKET, PRIOR_TRIAL: PRIOR_BRACKET}


def is_baseline(bracket: int) -> bool:
    """Whether a trial-rung, a row or an outcome of ``bracket`` is the baseline's."""
    return bracket == BASELINE_BRACKET


@dataclass
class FirstTrial:
    """``config`` trained straight to ``max_resource`` as trial ``trial_id`` (``PRIOR_TRIAL`` or ``BASELINE_TRIAL``)."""

    trial_id: str
    config: dict[str, Any]
    max_resource: int
    status: Status | None = None  # None: not handed out yet (or in flight when the state was saved)
    score: Score = None
    checkpoint: str | None = None
    error: str | None = None

    @property
    def bracket(self) -> int:
        return BRACKETS[self.trial_id]

    def report(self, resource: int, score: Score, checkpoint: str | None, error: str | None) -> list[Decision]:
        if self.status != "running" or resource != self.max_resource:
            raise ValueError(f"trial {self.trial_id} has no trial-rung to r={resource} in flight; report each once")
        lost = failed(score)
        self.status = "failed" if lost else "completed"
        self.score = as_score(score)
        self.checkpoint, self.error = (None, error or "failed") if lost else (checkpoint, None)
        if is_baseline(self.bracket):
            return []  # nothing of the search was decided
        return [Decision(self.status, self.bracket, 0, self.max_resource, self.trial_id, 1)]  # type: ignore[arg-type]

    def record(self) -> TrialRecord:
        return TrialRecord(self.trial_id, self.bracket, dict(self.config), self.status or "running", 0,
                           self.max_resource if self.status == "completed" else 0,
                           {} if self.status in (None, "running") else {self.max_resource: self.score}, self.error)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "max_resource": self.max_resource, "status": self.status, "score": self.score,
                "checkpoint": self.checkpoint, "error": self.error}


@dataclass
class Firsts:
    """A scheduler's first trials, in the order they are handed out (the baseline, then the prior's)."""

    trials: list[FirstTrial] = field(default_factory=list)

    @classmethod
    def of(cls, baseline: Mapping[str, Any] | None, prior: Mapping[str, Any] | None, max_resource: int) -> Firsts:
        """A new job's: the default config when it has a baseline, the priors' mode with ``--prior-first``."""
        return cls([FirstTrial(t, dict(c), max_resource) for t, c in ((BASELINE_TRIAL, baseline), (PRIOR_TRIAL, prior))
                    if c is not None])

    def next_trial_rung(self) -> TrialRung | None:
        for trial in self.trials:
            if trial.status is None:
                trial.status = "running"
                return TrialRung(trial.trial_id, trial.bracket, 0, trial.max_resource, dict(trial.config), None)
        return None

    def find(self, trial_id: str) -> FirstTrial | None:
        return next((t for t in self.trials if t.trial_id == trial_id), None)

    def running(self) -> list[str]:
        return [t.trial_id for t in self.trials if t.status == "running"]

    @property
    def done(self) -> bool:
        return all(t.status in ("completed", "failed") for t in self.trials)

    def records(self, ids: Iterable[str] | None, schedule: Callable[[Iterable[str] | None], list[TrialRecord]]
                ) -> list[TrialRecord]:
        """The search's records (not the baseline's): the prior's trial first, then ``schedule``'s; of ``ids``, in
        that order."""
        mine = {t.trial_id: t for t in self.trials if not is_baseline(t.bracket)}
        if ids is None:
            return [t.record() for t in mine.values() if t.status is not None] + schedule(None)
        ids = list(ids)
        others = iter(schedule([t for t in ids if t not in mine]) if any(t not in mine for t in ids) else [])
        return [mine[t].record() if t in mine else next(others) for t in ids]

    def requeue(self) -> None:
        for trial in self.trials:
            if trial.status == "running":  # in flight when saved: handed out again
                trial.status = None

    def to_json(self) -> dict[str, Any]:
        return {KEYS[t.trial_id]: t.to_json() for t in self.trials}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], requeue: bool = True) -> Firsts:
        """As saved beside the schedule's own; ``requeue``: a trial-rung in flight is handed out again."""
        trials = [FirstTrial(t, dict(m["config"]), m["max_resource"], m["status"], as_score(m["score"]),
                             m.get("checkpoint"), m["error"])
                  for t, key in KEYS.items() if (m := raw.get(key))]
        loaded = cls(trials)
        if requeue:
            loaded.requeue()
        return loaded


__all__ = ["BASELINE_BRACKET", "BASELINE_TRIAL", "PRIOR_BRACKET", "PRIOR_TRIAL", "FirstTrial", "Firsts", "is_baseline"]
