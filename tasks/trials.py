"""Train, evaluate, promote: the steps of a rung, each a thin task over plain code."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_hyperband.hyperband.scheduler import Promotion, Scheduler
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.trainers import factory
from prefect_hyperband.trainers.base import TrainResult


@dataclass(frozen=True)
class Evaluation:
    score: float
    seconds: float


@task(name="train", task_run_name="train {trial_id} to r={resource}", cache_policy=NO_CACHE)
def train_trial(job: Job, trial_id: str, config: dict[str, Any], resource: int, checkpoint: str | None) -> TrainResult:
    """Train one config to ``resource`` units, resuming from its checkpoint (fetched from the job's storage, the
    new one published there: both no-ops on a folder)."""
    trainer = factory.get(job.settings)
    store = job.store()
    trained = trainer.train(config, resource, store.fetch(checkpoint) if checkpoint else None,
                            job.checkpoint_path(trial_id, resource))
    return replace(trained, checkpoint=store.publish(trained.checkpoint))


@task(name="evaluate", task_run_name="evaluate {trial_id} at r={resource}", cache_policy=NO_CACHE)
def evaluate_trial(job: Job, trial_id: str, resource: int, trained: TrainResult) -> Evaluation:
    """The validation metric of a checkpoint, on the whole validation set."""
    began = time.perf_counter()
    value = factory.get(job.settings).evaluate(job.store().fetch(trained.checkpoint))
    return Evaluation(value, time.perf_counter() - began)


@task(name="promote", task_run_name="promote bracket s={s} rung {rung}", cache_policy=NO_CACHE)
def promote_rung(scheduler: Scheduler, s: int, rung: int) -> Promotion:
    """Close a rung of bracket s: the top ⌊n_i/η⌋ go up, the rest stop."""
    return scheduler.close(s)


@task(name="train default config", cache_policy=NO_CACHE)
def train_default(job: Job) -> float:
    """XGBoost's (or the model's) default config trained to R: the quality baseline of the summary."""
    trainer = factory.get(job.settings)
    result = trainer.train(job.default_config, job.max_resource, None, job.checkpoint_path("default", job.max_resource))
    return trainer.evaluate(result.checkpoint)
