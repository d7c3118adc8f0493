"""One config trained straight to R before the schedule: a wrapper of the job's scheduler hands it out first.

Two of them, either or both around ``HyperbandScheduler`` or ``AshaScheduler``:

* ``PriorFirst`` (``--prior-first``): the priors' mode (``priors.mode``), a trial of the search. PriorBand evaluated
  the prior first, at the highest fidelity, when it was published (NePS's PriorBand of then defaulted to
  ``sample_default_first`` and ``sample_default_at_target``; NePS today offers it as
  ``sample_prior_first="highest_fidelity"``). As there, the trial stands outside the brackets (bracket
  ``PRIOR_BRACKET``, one rung at R) and its result is not told to the sampler (NePS leaves it out of the table its
  brackets and sampler read); it is in the job's records, its best and its front like any trial.
* ``Baseline``: the model's default config, the summary's baseline (SageMaker's Hyperband post puts "default" beside
  "tuned"). No trial of the search: its result is not in ``records`` (the best, the champion, the front, the
  importances never see it), it decides nothing, it has no MLflow run of its own (the parent run gets its metric
  as ``default_<metric>``) and it meets no goal (``criteria``). Its row is the job's cost like any other
  (``accounting.summarise`` books it apart).

Either is a trial-rung like any other where it runs (a slot, the job's executor, its timeout, a stop, an
orchestration retry): the loop knows nothing of them. With several slots, the schedule's first jobs start beside
it. The job's state keeps it: a resume hands it out again only when it was in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping

from prefect_hyperband.hyperband.promotion import Score, as_score, failed
from prefect_hyperband.hyperband.scheduler import Decision, Scheduler, TrialRecord
from prefect_hyperband.hyperband.trial import Status, TrialRung

#: the trials added before the schedule: their ids and brackets (outside the schedule's 0..s_max)
PRIOR_TRIAL, PRIOR_BRACKET = "prior", -1
BASELINE_TRIAL, BASELINE_BRACKET = "default", -2


def is_baseline(bracket: int) -> bool:
    """Whether a trial-rung, a row or an outcome of ``bracket`` is the baseline's."""
    return bracket == BASELINE_BRACKET


@dataclass
class First:
    """``inner``, after ``config`` trained straight to ``max_resource`` (``TRIAL`` in ``BRACKET``)."""

    TRIAL: ClassVar[str]
    BRACKET: ClassVar[int]
    KEY: ClassVar[str]  # its part of the saved scheduler

    inner: Scheduler
    config: dict[str, Any]
    max_resource: int
    status: Status | None = None  # None: not handed out yet (or in flight when the state was saved)
    score: Score = None
    checkpoint: str | None = None
    error: str | None = None

    def next_trial_rung(self) -> TrialRung | None:
        if self.status is None:
            self.status = "running"
            return TrialRung(self.TRIAL, self.BRACKET, 0, self.max_resource, dict(self.config), None)
        return self.inner.next_trial_rung()

    def report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
               error: str | None = None) -> list[Decision]:
        if trial_id != self.TRIAL:
            return self.inner.report(trial_id, resource, score, checkpoint, error)
        if self.status != "running" or resource != self.max_resource:
            raise ValueError(f"trial {trial_id} has no trial-rung to r={resource} in flight; report each once")
        lost = failed(score)
        self.status = "failed" if lost else "completed"
        self.score = as_score(score)
        self.checkpoint, self.error = (None, error or "failed") if lost else (checkpoint, None)
        return self._decided()

    def _decided(self) -> list[Decision]:
        return [Decision(self.status, self.BRACKET, 0, self.max_resource, self.TRIAL, 1)]  # type: ignore[arg-type]

    def finish(self) -> list[Decision]:
        if self.status == "running":
            raise ValueError(f"cannot finish with trial-rungs in flight: report {self.TRIAL} first")
        return self.inner.finish()

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed") and self.inner.done

    def records(self, ids: Iterable[str] | None = None) -> list[TrialRecord]:
        if ids is not None:
            ids = list(ids)
            if self.TRIAL not in ids:
                return self.inner.records(ids)
            inner = iter(self.inner.records([t for t in ids if t != self.TRIAL]))
            return [self._record() if t == self.TRIAL else next(inner) for t in ids]
        return ([] if self.status is None else [self._record()]) + self.inner.records()

    def _record(self) -> TrialRecord:
        return TrialRecord(self.TRIAL, self.BRACKET, dict(self.config), self.status or "running", 0,
                           self.max_resource if self.status == "completed" else 0,
                           {} if self.status in (None, "running") else {self.max_resource: self.score}, self.error)

    def requeue(self) -> None:
        if self.status == "running":  # in flight when saved: handed out again
            self.status = None
        self.inner.requeue()

    def to_json(self) -> dict[str, Any]:
        return {**self.inner.to_json(), self.KEY: {
            "config": self.config, "max_resource": self.max_resource, "status": self.status, "score": self.score,
            "checkpoint": self.checkpoint, "error": self.error}}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], inner: Scheduler, requeue: bool = True) -> "First":
        """As saved; ``requeue``: the trial-rung, when in flight, is handed out again (``inner`` is loaded apart)."""
        mine = raw[cls.KEY]
        loaded = cls(inner, dict(mine["config"]), mine["max_resource"], mine["status"], as_score(mine["score"]),
                     mine.get("checkpoint"), mine["error"])
        if requeue and loaded.status == "running":
            loaded.status = None
        return loaded


class PriorFirst(First):
    """The priors' mode trained straight to R before the schedule (``--prior-first``): a trial of the search."""

    TRIAL, BRACKET, KEY = PRIOR_TRIAL, PRIOR_BRACKET, "prior_first"


class Baseline(First):
    """The default config trained straight to R before the schedule: the summary's baseline, no trial of the search."""

    TRIAL, BRACKET, KEY = BASELINE_TRIAL, BASELINE_BRACKET, "baseline"

    def _decided(self) -> list[Decision]:
        return []  # nothing of the search was decided

    def records(self, ids: Iterable[str] | None = None) -> list[TrialRecord]:
        return self.inner.records(ids)


__all__ = ["BASELINE_BRACKET", "BASELINE_TRIAL", "PRIOR_BRACKET", "PRIOR_TRIAL", "Baseline", "First", "PriorFirst",
           "is_baseline"]
