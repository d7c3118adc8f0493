"""ASHA (Li et al., MLSys 2020) as a subflow: whenever a slot frees, promote or start (Algorithm 2)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from prefect_hyperband.flows import runner
from prefect_hyperband.flows.state import load_asha, save_asha
from prefect_hyperband.hyperband.asha import AshaJob, AshaState
from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import close_trials, start_trial_runs


def make_sampler(job: Job, saved: dict[str, Any] | None = None):
    space = parse(job.space)
    if job.sampler == "tpe":
        return TPESampler.from_json(space, saved) if saved else TPESampler(space, job.seed, job.direction)  # type: ignore[arg-type]
    return RandomSampler.from_json(space, saved) if saved else RandomSampler(space, job.seed)


@flow(name="hyperband-asha", flow_run_name="asha", validate_parameters=False)
def asha_flow(job: Job, max_trials: int, time_budget: float | None = None) -> dict[str, Any]:
    """Keep ``job.concurrency`` trial-rungs in flight until ``max_trials`` configs or ``time_budget`` seconds."""
    logger = get_run_logger()
    saved = load_asha(job)
    if saved:
        state, sampler = AshaState.from_json(saved["state"]), make_sampler(job, saved["sampler"])
        rows, spent = saved["rows"], float(saved["elapsed"])
        logger.info("ASHA resumed: %d configs started, %d results kept", state.configs_started, len(rows))
    else:
        state, sampler, rows, spent = AshaState.create(job.min_resource, job.max_resource, job.eta, job.direction), make_sampler(job), [], 0.0  # type: ignore[arg-type]
    began = time.perf_counter()

    def elapsed() -> float:
        return spent + time.perf_counter() - began

    def can_start() -> bool:
        return state.configs_started < max_trials and (time_budget is None or elapsed() < time_budget)

    def save() -> None:
        save_asha(job, state, sampler.to_json(), rows, elapsed())

    running: dict[Any, runner.Submitted] = {}
    # trial-rungs that were in flight when a previous run of this job stopped: train them again first
    backlog = [_job_of(state, t) for t in state.in_flight()]
    while True:
        while len(running) < job.concurrency:
            todo = backlog.pop(0) if backlog else state.next_job(sampler.ask, can_start())
            if todo is None:
                break
            trial = state.trials[todo.trial_id]
            if trial.run_id is None:
                trial.run_id = start_trial_runs(job, todo.bracket, {todo.trial_id: todo.config})[todo.trial_id]
            sub = runner.submit(job, todo.trial_id, trial.run_id, todo.bracket, todo.rung, todo.config, todo.resource, todo.checkpoint)
            running[sub.log] = sub
            save()
        if not running:
            break
        finished = next(iter(as_completed(list(running))))
        result = runner.outcome(running.pop(finished))
        checkpoint = result.trained.checkpoint if result.trained and result.evaluated else None
        state.report(result.trial_id, result.resource, result.score, checkpoint, result.error)
        sampler.tell(state.trials[result.trial_id].config, result.resource, result.score)
        rows.append(result.row().__dict__)
        report.advance_progress(job.job_id)
        save()
        trial = state.trials[result.trial_id]
        if trial.status in ("failed", "completed"):
            close_trials(job, result.trial_id, [_entry(trial)])
        if result.error:
            logger.warning("trial %s failed at r=%d: %s", result.trial_id, result.resource, result.error)
        _progress(logger, job, state, result, len(rows))
    stopped = state.finish()
    save()
    if stopped:
        close_trials(job, "stopped trials", [_entry(state.trials[t]) for t in stopped])
    return {"state": {"trials": _trials_with_scores(state), "asha": state.to_json()}, "rows": rows}


def _trials_with_scores(state: AshaState) -> dict[str, dict[str, Any]]:
    """Trials as the bracket subflow reports them: with their score at every resource reached."""
    trials = {t: {**asdict(v), "scores": {}} for t, v in state.trials.items()}
    for r in state.rows():
        trials[r["trial_id"]]["scores"][str(r["resource"])] = r["score"]
    return trials


@task(name="asha", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10)
def run_asha(job: Job, max_trials: int, time_budget: float | None = None) -> dict[str, Any]:
    """ASHA's subflow from a task: retried, it resumes from the saved state (in-flight trials first)."""
    return asha_flow(job, max_trials, time_budget)


def _job_of(state: AshaState, trial_id: str) -> AshaJob:
    t = state.trials[trial_id]
    resource = state.plan(t.bracket).rungs[t.rung].resource
    return AshaJob(trial_id, t.bracket, t.rung, resource, dict(t.config), t.checkpoint)


def _entry(trial) -> dict[str, Any]:
    return {"run_id": trial.run_id, "rung": trial.rung, "resource": trial.resource, "status": trial.status, "error": trial.error}


def _progress(logger, job: Job, state: AshaState, result: runner.Outcome, n: int) -> None:
    best = state.best()
    logger.info(
        "asha: %s s=%d r=%d val_%s %s; %d results, %d configs, best %s",
        result.trial_id, result.bracket, result.resource, job.metric,
        "failed" if result.score is None else f"{result.score:.4f}", n, state.configs_started,
        "n/a" if best is None else f"{best[2]:.4f} ({best[0]} at r={best[1]})",
    )
