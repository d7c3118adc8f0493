"""One trial-rung: train → evaluate as Prefect tasks called with values.

Runs in a worker thread of the driver (``flows.driver``), inside the job flow's context, so both
tasks show up under the job's flow run. A trainer's failure is the trial's (an ``Outcome`` with an
error); an error of the orchestration itself (the Prefect API, say) propagates, and the driver
runs the trial-rung again. Its MLflow write (``record``: the trial-rung's metrics in one batch, to
the trial's child run, which the driver's MLflow writer creates while a new trial trains) runs on
that writer, before the driver records the result in the job's state: a job killed in between
trains that trial-rung again, but never leaves a recorded result without its run.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, replace

from prefect_hyperband.hyperband.accounting import TrialRung
from prefect_hyperband.hyperband.scheduler import TrialJob
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import log_trial_rung, start_trial_run, trial_params
from prefect_hyperband.tasks.trials import Evaluation, evaluate_trial, train_trial
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.base import TrainResult


@dataclass(frozen=True)
class Outcome:
    job: TrialJob
    run_id: str | None
    trained: TrainResult | None
    evaluated: Evaluation | None
    error: str | None
    started: float | None = None  # epoch seconds: training began, evaluation ended
    ended: float | None = None

    @property
    def score(self) -> float | None:
        return self.evaluated.score if self.evaluated is not None else None

    @property
    def checkpoint(self) -> str | None:
        return self.trained.checkpoint if self.trained is not None and self.evaluated is not None else None

    def row(self) -> TrialRung:
        j, t, e = self.job, self.trained, self.evaluated
        return TrialRung(
            trial_id=j.trial_id, bracket=j.bracket, rung=j.rung, resource=j.resource,
            resource_trained=t.resource_trained if t else 0, train_seconds=t.seconds if t else 0.0,
            eval_seconds=e.seconds if e else 0.0, workers=t.workers if t else 1, score=self.score,
            started=self.started, ended=self.ended,
        )


def run_trial_rung(job: Job, tj: TrialJob, run_id: str | None) -> Outcome:
    """Train ``tj`` (resuming its checkpoint) and evaluate it, here or as a flow run on the job's trial pool
    (``flows.trial``); never raises for the trainer's errors. ``record`` logs it after."""
    if job.trial_pool:
        from prefect_hyperband.flows.trial import run_remote

        return Outcome(tj, run_id, *run_remote(job, tj))
    return replace(work(job, tj), run_id=run_id)


def created_run(creating: Future[str]) -> str | None:
    """The run id a creation on the MLflow writer gave; None when it failed (the caller creates the run)."""
    try:
        return creating.result()
    except Exception:  # noqa: BLE001  (MLflow unreachable even after retries: record() tries again)
        return None


def work(job: Job, tj: TrialJob) -> Outcome:
    """The ``train`` and ``evaluate`` tasks of one trial-rung; a trainer's error is the outcome's, not raised."""
    trained_state = train_trial(job, tj.trial_id, tj.config, tj.resource, tj.checkpoint, return_state=True)
    trained = trained_state.result(raise_on_failure=False)
    if isinstance(trained, BaseException) or not trained_state.is_completed():
        return Outcome(tj, None, None, None, _describe(trained, trained_state))
    evaluated_state = evaluate_trial(job, tj.trial_id, tj.resource, trained, return_state=True)
    evaluated = evaluated_state.result(raise_on_failure=False)
    if isinstance(evaluated, BaseException) or not evaluated_state.is_completed():
        return Outcome(tj, None, trained, None, _describe(evaluated, evaluated_state))
    ended = time.time()
    started = ended - evaluated.seconds - trained.seconds  # the work itself, without the task runs around it
    return Outcome(tj, None, trained, evaluated, None, started, ended)


def record(job: Job, tj: TrialJob, run_id: str | None, began: float, out: Outcome,
           creating: Future[str] | None = None) -> Outcome:
    """The trial-rung's MLflow writes, before its result enters the job's state. A new trial's first result
    (``run_id`` None) goes to the run ``creating`` gives (created on the driver's MLflow writer while the
    trial trained; else to one created now), with the trial's params; ``began`` starts a run created now."""
    first = run_id is None
    if first and creating is not None:
        run_id = created_run(creating)
    if out.error is not None and stopping.requested():
        return replace(out, run_id=run_id)  # stopped, not failed: nothing to record, --resume trains it again
    params = None
    if first:
        if run_id is None:
            run_id = start_trial_run(job, tj.trial_id, tj.bracket, out.started or began)
        params = trial_params(job, tj.trial_id, tj.bracket, tj.config)
    if out.error is None or params is not None:
        log_trial_rung(job, run_id, tj.resource, out.trained if out.error is None else None, out.score, params)
    return replace(out, run_id=run_id)


def _describe(value: object, state: object) -> str:
    if isinstance(value, BaseException):
        text = str(value).strip()
        return f"{type(value).__name__}: {text}" if text else type(value).__name__
    return f"ended {getattr(state, 'type', state)}: {getattr(state, 'message', '')}"
