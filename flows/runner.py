"""One trial-rung as a small DAG of tasks (train → evaluate → log), and what came of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect.futures import PrefectFuture

from prefect_hyperband.hyperband.accounting import TrialRung
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import log_result
from prefect_hyperband.tasks.trials import Evaluation, evaluate_trial, train_trial
from prefect_hyperband.trainers.base import TrainResult


@dataclass
class Submitted:
    trial_id: str
    bracket: int
    rung: int
    resource: int
    train: PrefectFuture
    evaluate: PrefectFuture
    log: PrefectFuture


@dataclass(frozen=True)
class Outcome:
    trial_id: str
    bracket: int
    rung: int
    resource: int
    trained: TrainResult | None
    evaluated: Evaluation | None
    error: str | None

    @property
    def score(self) -> float | None:
        return self.evaluated.score if self.evaluated is not None else None

    def row(self) -> TrialRung:
        t, e = self.trained, self.evaluated
        return TrialRung(
            trial_id=self.trial_id, bracket=self.bracket, rung=self.rung, resource=self.resource,
            resource_trained=t.resource_trained if t else 0, train_seconds=t.seconds if t else 0.0,
            eval_seconds=e.seconds if e else 0.0, workers=t.workers if t else 1, score=self.score,
        )


def submit(job: Job, trial_id: str, run_id: str, bracket: int, rung: int, config: dict[str, Any],
           resource: int, checkpoint: str | None) -> Submitted:
    """Submit train → evaluate → log for one trial at one rung; returns at once.

    Wait on ``.log``: it settles last, also when an upstream step failed (it is then NotReady).
    """
    trained = train_trial.submit(job, trial_id, config, resource, checkpoint)
    evaluated = evaluate_trial.submit(job, trial_id, resource, trained)
    logged = log_result.submit(job, run_id, trial_id, resource, trained, evaluated)
    return Submitted(trial_id, bracket, rung, resource, trained, evaluated, logged)


def outcome(sub: Submitted) -> Outcome:
    """What a finished trial-rung gave: a score, or the error of the step that failed (never raises)."""
    trained = sub.train.result(raise_on_failure=False)
    if isinstance(trained, BaseException):
        return Outcome(sub.trial_id, sub.bracket, sub.rung, sub.resource, None, None, _describe(trained))
    evaluated = sub.evaluate.result(raise_on_failure=False)
    if isinstance(evaluated, BaseException):
        return Outcome(sub.trial_id, sub.bracket, sub.rung, sub.resource, trained, None, _describe(evaluated))
    return Outcome(sub.trial_id, sub.bracket, sub.rung, sub.resource, trained, evaluated, None)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
