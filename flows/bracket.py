"""A synchronous bracket (successive halving) as a subflow: each rung trains its trials, then promotes."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from prefect_hyperband.flows import runner
from prefect_hyperband.flows.state import load_bracket, save_bracket
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.hyperband.promotion import sort_key
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import close_trials, start_trial_runs
from prefect_hyperband.tasks.trials import promote_rung


@flow(name="hyperband-bracket", flow_run_name="bracket s={s}", validate_parameters=False)
def bracket_flow(job: Job, s: int, configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Successive halving for bracket s; resumes from the job's saved state when there is one."""
    logger = get_run_logger()
    saved = load_bracket(job, s)
    if saved is None:
        plan = {b.s: b for b in schedule.brackets(job.min_resource, job.max_resource, job.eta)}
        queue = list(configs or [])
        ask = (lambda: queue.pop(0)) if configs else None
        state = BracketState.start(plan[s], job.eta, parse(job.space), job.seed, job.direction, ask)  # type: ignore[arg-type]
        rows: list[dict[str, Any]] = []
    else:
        state, rows = saved
        logger.info("bracket s=%d resumed at rung %d: %d results kept", s, state.rung_index, len(rows))
        ended = [t for t, v in state.trials.items() if v.status != "running" and v.run_id]
        if ended:  # closing again is harmless; a kill between promotion and closing left them open
            close_trials(job, f"bracket s={s} (resumed)", [_entry(state, t) for t in ended])
    missing = {t: v.config for t, v in state.trials.items() if v.run_id is None}
    if missing:
        for trial_id, run_id in start_trial_runs(job, s, missing).items():
            state.trials[trial_id].run_id = run_id
        save_bracket(job, state, rows)
    while not state.done:
        rung, i = state.current, state.rung_index
        pending = [
            runner.submit(job, t, state.trials[t].run_id, s, i, state.trials[t].config, rung.resource, state.trials[t].checkpoint)
            for t in state.pending()
        ]
        by_log = {sub.log: sub for sub in pending}
        for done in as_completed(list(by_log)):
            result = runner.outcome(by_log[done])
            state.record(result.trial_id, rung.resource, result.score, result.trained and result.trained.checkpoint, result.error)
            rows.append(result.row().__dict__)
            report.advance_progress(job.job_id)
            save_bracket(job, state, rows)  # a killed job keeps every finished trial-rung
            if result.error:
                logger.warning("trial %s failed at r=%d: %s", result.trial_id, rung.resource, result.error)
        before = list(state.active)
        state = BracketState.from_json(promote_rung(job, s, i, state.to_json()))
        save_bracket(job, state, rows)
        ended = [t for t in before if state.trials[t].status != "running"]
        close_trials(job, f"bracket s={s} rung {i}", [_entry(state, t) for t in ended])
        _progress(logger, job, state, s, i, rung.resource, before)
    return {"state": state.to_json(), "rows": rows}


@task(name="bracket", task_run_name="bracket s={s}", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10)
def run_bracket(job: Job, s: int, configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run a bracket subflow from a task, so that brackets run side by side under the job's slot cap.

    Retried: the subflow resumes from the bracket's saved state, so an orchestration error (say the
    Prefect API answering 503 under load) costs at most the trial-rungs that were in flight.
    """
    return bracket_flow(job, s, configs)


def _entry(state: BracketState, trial_id: str) -> dict[str, Any]:
    t = state.trials[trial_id]
    return {"run_id": t.run_id, "rung": t.rung, "resource": t.resource, "status": t.status, "error": t.error}


def _progress(logger, job: Job, state: BracketState, s: int, i: int, resource: int, trials: list[str]) -> None:
    scores = {t: state.trials[t].scores.get(resource) for t in trials}
    ranked = sorted(scores, key=lambda t: sort_key(t, scores[t], job.direction))  # type: ignore[arg-type]
    top = ranked[0] if ranked else None
    failed = sum(v is None for v in scores.values())
    logger.info(
        "bracket s=%d rung %d/%d: %d trials at r=%d, best val_%s %s (%s)%s; %s",
        s, i + 1, len(state.rungs), len(scores), resource, job.metric,
        "n/a" if top is None or scores[top] is None else f"{scores[top]:.4f}", top,
        f", {failed} failed" if failed else "",
        f"promoted {len(state.active)}" if not state.done else "bracket done",
    )
