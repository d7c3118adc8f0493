"""The tuning job: a flow of brackets; each bracket a subflow whose rungs are train → evaluate → promote."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from flows.job import prepare
from flows.params import TuneParams
from hyperband import schedule
from hyperband.accounting import Summary, TrialRung, summarise, table
from hyperband.bracket import BracketState
from hyperband.promotion import sort_key
from hyperband.space import parse
from tasks.job import Job
from tasks.record import finish_job_run, log_rung, register_champion, start_job_run, start_trial_runs
from tasks.trials import evaluate_trial, promote_rung, train_default, train_trial
from trainers import factory


@flow(name="hyperband-bracket", flow_run_name="bracket s={s}", validate_parameters=False)
def bracket_flow(job: Job, s: int) -> dict[str, Any]:
    """Successive halving for bracket s: every rung trains its trials concurrently, then promotes."""
    logger = get_run_logger()
    plan = {b.s: b for b in schedule.brackets(job.min_resource, job.max_resource, job.eta)}
    state = BracketState.start(plan[s], job.eta, parse(job.space), job.seed, job.direction)  # type: ignore[arg-type]
    run_ids = start_trial_runs(job, s, {t: v.config for t, v in state.trials.items()})
    rows: list[TrialRung] = []
    while not state.done:
        rung, i = state.current, state.rung_index
        futures = {}
        for trial_id in state.pending():
            trial = state.trials[trial_id]
            trained = train_trial.submit(job, trial_id, trial.config, rung.resource, trial.checkpoint)
            futures[trial_id] = (trained, evaluate_trial.submit(job, trial_id, rung.resource, trained))
        wait([f for pair in futures.values() for f in pair])
        outcomes = {}
        for trial_id, (trained_f, evaluated_f) in futures.items():
            trained = trained_f.result(raise_on_failure=False)
            evaluated = evaluated_f.result(raise_on_failure=False) if not isinstance(trained, BaseException) else trained
            if isinstance(evaluated, BaseException):
                error = f"{type(evaluated).__name__}: {evaluated}"
                state.record(trial_id, rung.resource, None, None, error)
                logger.warning("trial %s failed at r=%d: %s", trial_id, rung.resource, error)
                trained = trained if not isinstance(trained, BaseException) else None
            else:
                state.record(trial_id, rung.resource, evaluated.score, trained.checkpoint)
            outcomes[trial_id] = (trained, evaluated)
            rows.append(_row(state, trial_id, i, rung.resource, trained, evaluated))
        state = BracketState.from_json(promote_rung(job, s, i, state.to_json()))
        log_rung(job, s, i, [_entry(job, state, t, run_ids[t], rung.resource, *outcomes[t]) for t in outcomes])
        _progress(logger, job, state, s, i, rung, outcomes)
    return {"state": state.to_json(), "rows": [r.__dict__ for r in rows], "run_ids": run_ids}


@flow(name="hyperband-tune", flow_run_name="hyperband {params.model} on {params.data}", validate_parameters=True)
def tune(params: TuneParams) -> dict[str, Any]:
    """Hyperband over ``params``: every bracket of Li et al. (JMLR 2018), tracked in MLflow."""
    logger = get_run_logger()
    began = time.perf_counter()
    job = prepare(params)
    plan = schedule.plan_summary(job.min_resource, job.max_resource, job.eta)
    logger.info(
        "job %s: %d brackets, %d configs, %d trial-rungs, %d units (vs %d without early stopping); dir %s",
        job.job_id, len(plan["brackets"]), plan["configs"], plan["trial_rungs"], plan["resource_used"],
        plan["resource_without_early_stopping"], job.job_dir,
    )
    job = job.with_parent(start_job_run(job, _run_params(job, params)))
    factory.get(job.settings)  # start the cluster and load the data once, before the first trial
    try:
        baseline = train_default.submit(job) if params.baseline else None
        brackets = []
        runner = ThreadPoolTaskRunner(max_workers=job.concurrency)
        for b in plan["brackets"]:
            brackets.append(bracket_flow.with_options(task_runner=runner)(job, b["s"]))
        default_score = _baseline_score(baseline, logger)
        summary, best = _summarise(job, plan, brackets, default_score, time.perf_counter() - began)
        version = None
        if best is not None and params.register_model:
            version = register_champion(job, best["run_id"], best["checkpoint"])
        metrics = {
            f"best_val_{job.metric}": summary.best_score,
            f"default_val_{job.metric}": summary.default_score,
            "resource_used": summary.resource_used,
            "resource_without_early_stopping": summary.resource_without_early_stopping,
            "worker_seconds": summary.worker_seconds,
            "worker_seconds_without_early_stopping": summary.worker_seconds_without_early_stopping,
            "wall_seconds": time.perf_counter() - began,
            "sequential_seconds": summary.sequential_seconds,
            "failed_trials": summary.failed_trials,
        }
        best_config = {"trial_id": best["trial_id"], "resource": best["resource"], f"val_{job.metric}": best["score"],
                       "config": best["config"]} if best else {}
        finish_job_run(job, metrics, best_config, summary.to_json(), table(summary))
        logger.info("summary\n%s", table(summary))
        return {
            "job_id": job.job_id,
            "job_dir": job.job_dir,
            "parent_run_id": job.parent_run_id,
            "summary": summary.to_json(),
            "table": table(summary),
            "best": best,
            "champion_version": version,
        }
    finally:
        factory.release(job.settings)


def _row(state: BracketState, trial_id: str, rung: int, resource: int, trained: Any, evaluated: Any) -> TrialRung:
    ok_train = trained is not None and not isinstance(trained, BaseException)
    ok_eval = not isinstance(evaluated, BaseException)
    return TrialRung(
        trial_id=trial_id,
        bracket=state.s,
        rung=rung,
        resource=resource,
        resource_trained=trained.resource_trained if ok_train else 0,
        train_seconds=trained.seconds if ok_train else 0.0,
        eval_seconds=evaluated.seconds if ok_eval else 0.0,
        workers=trained.workers if ok_train else 1,
        score=evaluated.score if ok_eval else None,
    )




def _entry(job: Job, state: BracketState, trial_id: str, run_id: str, resource: int, trained: Any, evaluated: Any) -> dict[str, Any]:
    trial = state.trials[trial_id]
    ok = not isinstance(evaluated, BaseException)
    ok_train = trained is not None and not isinstance(trained, BaseException)
    return {
        "run_id": run_id,
        "resource": resource,
        "resource_held": trial.resource,
        "score": evaluated.score if ok else None,
        "train_seconds": trained.seconds if ok_train else 0.0,
        "workers": trained.workers if ok_train else job.settings.workers,
        "history": trained.history if ok_train else [],
        "status": trial.status,
        "error": trial.error,
    }


def _progress(logger, job: Job, state: BracketState, s: int, i: int, rung, outcomes) -> None:
    scores = {t: (e.score if not isinstance(e, BaseException) else None) for t, (_, e) in outcomes.items()}
    ranked = sorted(scores, key=lambda t: sort_key(t, scores[t], job.direction))  # type: ignore[arg-type]
    top = ranked[0] if ranked else None
    failed = sum(v is None for v in scores.values())
    logger.info(
        "bracket s=%d rung %d/%d: %d trials at r=%d, best val_%s %s (%s)%s; %s",
        s, i + 1, len(state.rungs), len(scores), rung.resource, job.metric,
        "n/a" if top is None or scores[top] is None else f"{scores[top]:.4f}", top,
        f", {failed} failed" if failed else "",
        f"promoted {len(state.active)}" if not state.done else "bracket done",
    )


def _baseline_score(baseline, logger) -> float | None:
    if baseline is None:
        return None
    value = baseline.result(raise_on_failure=False)
    if isinstance(value, BaseException):
        logger.warning("default config failed: %s", value)
        return None
    return float(value)


def _summarise(job: Job, plan: dict[str, Any], brackets: list[dict[str, Any]], default_score, wall: float):
    rows = [TrialRung(**r) for b in brackets for r in b["rows"]]
    states = [BracketState.from_json(b["state"]) for b in brackets]
    candidates = []  # every evaluated (trial, resource): the paper returns the best seen
    for b, st in zip(brackets, states):
        for t in st.trials.values():
            for resource, value in t.scores.items():
                if value is not None:
                    candidates.append((t, resource, value, b["run_ids"][t.trial_id]))
    best = None
    if candidates:
        t, resource, value, run_id = min(candidates, key=lambda c: sort_key(f"{c[0].trial_id}@{c[1]:06d}", c[2], job.direction))  # type: ignore[arg-type]
        best = {"trial_id": t.trial_id, "resource": resource, "score": value, "config": t.config, "run_id": run_id,
                "checkpoint": job.checkpoint_path(t.trial_id, resource), "bracket": t.bracket}
    summary: Summary = summarise(
        rows,
        metric=job.metric,
        configs=plan["configs"],
        max_resource=job.max_resource,
        reached_max_resource=sum(1 for st in states for t in st.trials.values() if t.status == "completed"),
        failed_trials=sum(1 for st in states for t in st.trials.values() if t.status == "failed"),
        best=(best["trial_id"], best["resource"], best["score"]) if best else None,
        default_score=default_score,
        wall_seconds=wall,
    )
    return summary, best


def _run_params(job: Job, params: TuneParams) -> dict[str, Any]:
    return {
        "min_resource": job.min_resource,
        "max_resource": job.max_resource,
        "eta": job.eta,
        "seed": job.seed,
        "model": job.settings.model,
        "workers": job.settings.workers,
        "data": params.data,
        "metric": job.metric,
        "concurrency": job.concurrency,
        "rounds_per_unit": job.settings.rounds_per_unit if job.settings.model == "xgboost" else "",
        "dask_address": job.settings.dask_address or "",
        "space": job.space,
    }
