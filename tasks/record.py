"""Tasks that write to MLflow; retried, since a tracking server may blip mid-job."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_hyperband.tasks import tracking
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.trainers import factory
from prefect_hyperband.trainers.base import TrainResult

RETRY = dict(retries=3, retry_delay_seconds=[1, 5, 15], cache_policy=NO_CACHE)


@task(name="start parent run", **RETRY)
def start_job_run(job: Job, params: dict[str, Any]) -> str:
    tags = {"hyperband.job_id": job.job_id, "hyperband.job_dir": job.job_dir, "hyperband.metric": job.metric}
    return tracking.start_parent(job.tracking_uri, job.experiment, f"hyperband-{job.job_id}", params, tags)


@task(name="start trial runs", task_run_name="start trial runs of bracket s={s}", **RETRY)
def start_trial_runs(job: Job, s: int, trials: dict[str, dict[str, Any]]) -> dict[str, str]:
    """One nested child run per trial; returns trial id -> run id.

    Idempotent: a retry, or a job resumed after being killed between creating runs and saving
    their ids, reuses the child runs that exist instead of creating them twice.
    """
    assert job.parent_run_id is not None
    existing = tracking.existing_children(job.tracking_uri, job.parent_run_id)
    ids = {t: existing[t] for t in trials if t in existing}
    for trial_id, config in trials.items():
        if trial_id in ids:
            continue
        params = {**config, "workers": job.settings.workers, "trial_id": trial_id, "bracket": s}
        if "batch_size" in config:  # data parallel: each replica sees batch_size rows a step
            world = job.settings.workers * job.settings.nnodes
            params.update(per_replica_batch_size=config["batch_size"], global_batch_size=config["batch_size"] * world)
        tags = {"hyperband.bracket": str(s), "hyperband.trial_id": trial_id, "hyperband.status": "running"}
        ids[trial_id] = tracking.start_child(job.tracking_uri, job.parent_run_id, trial_id, params, tags)
    return ids


@task(name="log result", task_run_name="log {trial_id} at r={resource}", **RETRY)
def log_result(job: Job, run_id: str, trial_id: str, resource: int, trained: TrainResult, evaluated: Any) -> None:
    """A trial-rung's metric at step = cumulative resource, with what the trainer recorded on the way."""
    uri = job.tracking_uri
    if trained.history:
        tracking.log_history(uri, run_id, trained.history)
    metric = f"val_{job.metric}"
    metrics = {"train_seconds": trained.seconds, "worker_seconds": trained.seconds * trained.workers}
    if not any(row.get("step") == resource and metric in row for row in trained.history):
        metrics[metric] = evaluated.score  # unless the per-unit history already holds it at this step
    metrics.update({k: v for k, v in trained.info.items() if isinstance(v, (int, float))})
    tracking.log_metrics(uri, run_id, metrics, step=resource)


@task(name="close trial runs", task_run_name="close trial runs of {label}", **RETRY)
def close_trials(job: Job, label: str, entries: list[dict[str, Any]]) -> None:
    """Status tags of trials whose fate is known (stopped, failed, completed); their runs end."""
    for e in entries:
        tags = {"hyperband.highest_rung": str(e["rung"]), "hyperband.resource": str(e["resource"]), "hyperband.status": e["status"]}
        if e.get("error"):
            tags["hyperband.error"] = e["error"][-4000:]
        tracking.set_tags(job.tracking_uri, e["run_id"], tags)
        if e["status"] != "running":
            tracking.end_run(job.tracking_uri, e["run_id"], "FAILED" if e["status"] == "failed" else "FINISHED")


@task(name="finish parent run", **RETRY)
def finish_job_run(job: Job, metrics: dict[str, float], best_config: dict[str, Any], summary: dict[str, Any], table: str) -> None:
    assert job.parent_run_id is not None
    uri, run_id = job.tracking_uri, job.parent_run_id
    tracking.log_metrics(uri, run_id, metrics)
    tracking.log_json(uri, run_id, best_config, "best_config.json")
    tracking.log_json(uri, run_id, summary, "summary.json")
    tracking.log_text(uri, run_id, table + "\n", "summary.txt")
    tracking.end_run(uri, run_id, "FINISHED")


@task(name="register champion", **RETRY)
def register_champion(job: Job, run_id: str, checkpoint: str) -> int:
    """The best trial's model in its flavour, registered under the experiment's name with alias champion."""
    trainer = factory.get(job.settings)
    version = tracking.log_champion(job.tracking_uri, run_id, trainer, checkpoint, job.experiment)
    tracking.set_tags(job.tracking_uri, job.parent_run_id, {"hyperband.champion_version": version, "hyperband.best_run_id": run_id})
    return version
