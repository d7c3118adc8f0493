"""The tuning job: Hyperband brackets side by side (or ASHA), then the champion and the accounting."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_hyperband.flows.asha import make_sampler, run_asha
from prefect_hyperband.flows.bracket import run_bracket
from prefect_hyperband.flows.job import prepare
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.flows.state import save_job_record
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.hyperband.accounting import Summary, TrialRung, summarise, table
from prefect_hyperband.hyperband.promotion import sort_key
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import finish_job_run, register_champion, start_job_run
from prefect_hyperband.tasks.trials import train_default
from prefect_hyperband.trainers import factory

FLAVOURED = ("xgboost", "torch")  # models with an MLflow flavour to register


@flow(
    name="hyperband-tune",
    flow_run_name="hyperband {params.model} on {params.data}",
    task_runner=ThreadPoolTaskRunner(max_workers=16),  # brackets side by side; trials capped by job slots
)
def tune(params: TuneParams) -> dict[str, Any]:
    """Hyperband (Li et al., JMLR 2018) or ASHA (Li et al., MLSys 2020) over ``params``, tracked in MLflow."""
    logger = get_run_logger()
    began = time.perf_counter()
    job = prepare(params)
    plan = schedule.plan_summary(job.min_resource, job.max_resource, job.eta)
    logger.info(
        "job %s (%s, %s sampler, %d slots): %d brackets, %d configs, %d trial-rungs, %d units "
        "(vs %d without early stopping); dir %s",
        job.job_id, job.mode, job.sampler, job.concurrency, len(plan["brackets"]), plan["configs"],
        plan["trial_rungs"], plan["resource_used"], plan["resource_without_early_stopping"], job.job_dir,
    )
    if job.parent_run_id is None:
        job = job.with_parent(start_job_run(job, _run_params(job, params)))
    save_job_record(job, params.model_dump(mode="json"))
    report.report_start(plan["trial_rungs"], job.job_id)
    factory.get(job.settings)  # start the cluster and load the data once, before the first trial
    try:
        baseline = train_default.submit(job) if params.baseline else None
        if job.mode == "asha":
            results = [run_asha.submit(job, params.max_trials or plan["configs"], params.time_budget).result()]
        elif job.sampler == "tpe":
            results = _brackets_in_turn(job, plan)
        else:
            futures = [run_bracket.submit(job, b["s"]) for b in plan["brackets"]]
            wait(futures)
            results = [f.result() for f in futures]
        default_score = _baseline_score(baseline, logger)
        summary, best = _summarise(job, results, default_score, time.perf_counter() - began)
        version = None
        if best is not None and params.register_model and job.settings.model in FLAVOURED:
            registered = register_champion(job, best["run_id"], best["checkpoint"], return_state=True)
            if registered.is_completed():
                version = registered.result()
            else:  # the results stand without a registered model: say so, keep the job
                logger.error("could not register the champion model: %s", registered.message)
        metrics = {
            f"best_val_{job.metric}": summary.best_score,
            f"default_val_{job.metric}": summary.default_score,
            "configs": summary.configs,
            "resource_used": summary.resource_used,
            "resource_without_early_stopping": summary.resource_without_early_stopping,
            "worker_seconds": summary.worker_seconds,
            "worker_seconds_without_early_stopping": summary.worker_seconds_without_early_stopping,
            "wall_seconds": time.perf_counter() - began,
            "sequential_seconds": summary.sequential_seconds,
            "failed_trials": summary.failed_trials,
        }
        best_config = (
            {"trial_id": best["trial_id"], "resource": best["resource"], f"val_{job.metric}": best["score"], "config": best["config"]}
            if best
            else {}
        )
        report.report_results(
            report.rows_from_results(results), report.configs_from_results(results), summary, job.metric,
            job.direction, job.tracking_uri, job.parent_run_id, title=f"Hyperband job {job.job_id}",
            extra={"MLflow parent run": job.parent_run_id, "champion version": version}, job_id=job.job_id,
        )
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


def _brackets_in_turn(job: Job, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """BOHB-style: brackets one after another, each sampling from TPE fitted on the results so far."""
    sampler = make_sampler(job)
    results = []
    for b in plan["brackets"]:
        n = b["rungs"][0]["n_configs"]
        result = run_bracket.submit(job, b["s"], [sampler.ask() for _ in range(n)]).result()
        for trial in result["state"]["trials"].values():
            for resource, score in trial["scores"].items():
                sampler.tell(trial["config"], int(resource), score)
        results.append(result)
    return results


def _baseline_score(baseline, logger) -> float | None:
    if baseline is None:
        return None
    value = baseline.result(raise_on_failure=False)
    if isinstance(value, BaseException):
        logger.warning("default config failed: %s", value)
        return None
    return float(value)


def _summarise(job: Job, results: list[dict[str, Any]], default_score: float | None, wall: float) -> tuple[Summary, dict | None]:
    rows = [TrialRung(**r) for result in results for r in result["rows"]]
    trials = [t for result in results for t in result["state"]["trials"].values()]
    candidates = [  # every evaluated (trial, resource): the paper returns the best seen
        (t, int(resource), value) for t in trials for resource, value in _scores(t).items() if value is not None
    ]
    best = None
    if candidates:
        t, resource, value = min(candidates, key=lambda c: sort_key(f"{c[0]['trial_id']}@{c[1]:06d}", c[2], job.direction))  # type: ignore[arg-type]
        best = {"trial_id": t["trial_id"], "resource": resource, "score": value, "config": t["config"],
                "run_id": t["run_id"], "checkpoint": job.checkpoint_path(t["trial_id"], resource), "bracket": t["bracket"]}
    summary = summarise(
        rows,
        metric=job.metric,
        configs=len(trials),
        max_resource=job.max_resource,
        reached_max_resource=sum(1 for t in trials if t["status"] == "completed"),
        failed_trials=sum(1 for t in trials if t["status"] == "failed"),
        best=(best["trial_id"], best["resource"], best["score"]) if best else None,
        default_score=default_score,
        wall_seconds=wall,
    )
    return summary, best


def _scores(trial: dict[str, Any]) -> dict[int, float | None]:
    """A trial's score at every resource it reached (JSON keys are strings)."""
    return {int(k): v for k, v in trial["scores"].items()}


def _run_params(job: Job, params: TuneParams) -> dict[str, Any]:
    return {
        "min_resource": job.min_resource,
        "max_resource": job.max_resource,
        "eta": job.eta,
        "seed": job.seed,
        "model": job.settings.model,
        "workers": job.settings.workers,
        "mode": job.mode,
        "sampler": job.sampler,
        "data": params.data if job.settings.model != "synthetic" else "",
        "metric": job.metric,
        "concurrency": job.concurrency,
        "rounds_per_unit": job.settings.rounds_per_unit if job.settings.model == "xgboost" else "",
        "dask_address": job.settings.dask_address or "",
        "space": job.space,
    }
