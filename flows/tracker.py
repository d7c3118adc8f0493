"""The loop's ``Tracker`` on MLflow: every write on one writer thread, in order, off the trial-rungs' path.

A new trial's child run is created while it trains; a trial-rung's metrics (with the trial's params on its
first) are written once it is evaluated, before its result enters the job's state, so a job killed in
between trains that trial-rung again but never leaves a recorded result without its run; the runs of
decided trials are closed after. The map trial id -> run id is this side's (saved with the job's state).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from prefect_hyperband.flows.loop import Outcome
from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.hyperband.trial import TrialJob
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import close_trial_runs, log_trial_rung, start_trial_run, trial_params
from prefect_hyperband.trainers.stopping import StopToken


class MlflowTracker:
    """``runs``: trial id -> child run (saved ones, and those a killed run of the job created: reused)."""

    def __init__(self, job: Job, runs: dict[str, str], records: Callable[..., list[TrialRecord]], stop: StopToken,
                 warn: Callable[[str], None]) -> None:
        self.job, self.runs, self.records, self.stop, self.warn = job, runs, records, stop, warn
        self.creating: dict[str, Future[str]] = {}
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")

    def start(self, todo: TrialJob) -> None:
        t = todo.trial_id
        if t in self.runs or t in self.creating:
            return
        self.creating[t] = self.writer.submit(start_trial_run, self.job, t, todo.bracket, time.time())

    def record(self, out: Outcome) -> Future[Outcome]:
        return self.writer.submit(self._write, out)

    def record_failure(self, out: Outcome) -> Outcome:
        try:
            return self.record(out).result()
        except Exception as why:  # the result stands in the state; the run gets it on a resume's close
            self.warn(f"MLflow: no run for failed trial {out.job.trial_id}: {why}")
            return out

    def _write(self, out: Outcome) -> Outcome:
        """On the writer thread: the trial-rung's metrics, to the trial's run (made now if its creation failed)."""
        tj = out.job
        run_id = self.runs.get(tj.trial_id)
        if run_id is None:
            run_id = self._created(tj.trial_id) or start_trial_run(self.job, tj.trial_id, tj.bracket, out.started or time.time())
            self.runs[tj.trial_id] = run_id
        if out.error is not None and self.stop.requested():
            return out  # stopped, not failed: nothing to record, --resume trains it again
        # a trial's first rung brings its params (again, the same values, when it is trained again after a kill)
        params = trial_params(self.job, tj.trial_id, tj.bracket, tj.config) if tj.rung == 0 else None
        if out.error is None or params is not None:
            log_trial_rung(self.job, run_id, tj.resource, out.trained if out.error is None else None, out.metric, params,
                           out.evaluated.metrics if out.evaluated is not None else None)
        return out

    def _created(self, trial_id: str) -> str | None:
        future = self.creating.pop(trial_id, None)
        try:
            return future.result() if future is not None else None
        except Exception:  # noqa: BLE001  (MLflow unreachable even after retries: the caller creates the run)
            return None

    def close(self, trial_ids: list[str]) -> None:
        records = self.records(trial_ids)

        def write() -> None:
            try:
                close_trial_runs(self.job, records, self.runs)
            except Exception as exc:  # the results stand in the job's state; a resume closes them again
                self.warn(f"MLflow: closing {len(records)} trial runs failed after retries: {type(exc).__name__}: {exc}")

        self.writer.submit(write)

    def drain(self) -> None:
        """Every write done; runs created for trials that left no result yet are kept (``runs``) for --resume."""
        self.writer.shutdown(wait=True)
        for trial_id in list(self.creating):
            run_id = self._created(trial_id)
            if run_id is not None and trial_id not in self.runs:
                self.runs[trial_id] = run_id
