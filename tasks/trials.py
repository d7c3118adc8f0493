"""Train, evaluate, promote: the steps of a rung, each a thin task over plain code."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_hyperband.common.errors import full_disk, no_space
from prefect_hyperband.executors.job import Job
from prefect_hyperband.trainers import registry, stopping
from prefect_hyperband.trainers.base import Evaluation, Trainer, TrainResult, checkpoint_damage, size_of

F = TypeVar("F", bound=Callable[..., Any])

#: the mark of an error raised inside a trial-rung's task: the trial's failure (its task run Failed). The caller takes
#: the task's value, not its state (``State.result`` is a round trip through Prefect's event-loop thread, twice per
#: trial-rung), and tells such an error from one of the orchestration around the task (``flows.runner``)
TRIAL_ERROR = "hyperband_trial_error"


def trial_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a trial-rung's task (the trial's failure), not around it."""
    return bool(getattr(exc, TRIAL_ERROR, False))


def _marks_its_errors(fn: F) -> F:
    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            setattr(exc, TRIAL_ERROR, True)
            raise

    return marked  # type: ignore[return-value]


@task(name="train", task_run_name="train {trial_id} to r={resource}", cache_policy=NO_CACHE,
      persist_result=False)  # a task worker's trial-rung persists (Prefect's background tasks do): not these
@_marks_its_errors
def train_trial(job: Job, trainer: Trainer, trial_id: str, config: dict[str, Any], resource: int,
                checkpoint: str | None) -> TrainResult:
    """Train one config to ``resource`` units with the job's ``trainer``, resuming from its checkpoint (fetched from
    the job's storage, the new one published there: both no-ops on a folder). A damaged checkpoint is trained again
    first."""
    store = job.store()
    local = store.fetch(checkpoint) if checkpoint else None
    rebuilt: TrainResult | None = None
    if local is not None and (why := checkpoint_damage(local)) is not None:
        rebuilt = rebuild(job, trainer, trial_id, config, _resource_of(job, checkpoint))
        get_run_logger().warning("trial %s: checkpoint %s is %s; trained it again from %s (%d units, %.1f s)",
                                 trial_id, checkpoint, why, rebuilt.info.get("rebuilt_from", "scratch"),
                                 rebuilt.resource_trained, rebuilt.seconds)
        local = rebuilt.checkpoint
    out = job.checkpoint_path(trial_id, resource)
    try:
        trained = trainer.train(config, resource, local, out)
    except Exception as exc:
        if no_space(exc):  # not the trial's failure: the job stops, --resume trains it once space is freed
            raise _stop_full(getattr(exc, "filename", None) or out) from exc
        raise
    if "exit_kept" in trained.info:  # a rank ended non-zero after the work (``trainers.exits``)
        get_run_logger().warning("trial %s: %s", trial_id, trained.info["exit_kept"])
    if rebuilt is not None:  # the units and seconds spent rebuilding are this call's: counted, not hidden
        trained = replace(trained, resource_trained=trained.resource_trained + rebuilt.resource_trained,
                          seconds=trained.seconds + rebuilt.seconds,
                          info={**trained.info, "rebuilt_units": float(rebuilt.resource_trained)})
    return replace(trained, checkpoint=store.publish(trained.checkpoint))


def _stop_full(path: str) -> stopping.Stopped:
    """The job stops (its state saved) because the disk is full; this trial-rung is trained again by --resume."""
    reason = full_disk(path)
    token = stopping.current()
    if token is not None:
        token.request(reason=reason)
    return stopping.Stopped(reason)


def rebuild(job: Job, trainer: Trainer, trial_id: str, config: dict[str, Any], resource: int) -> TrainResult:
    """The trial's checkpoint at ``resource`` written again by the calls that first wrote it: from its newest
    whole checkpoint below (or from scratch where the trial began), one rung at a time, so a deterministic trainer
    writes the same bytes. Its ``resource_trained`` and ``seconds`` add up every call."""
    store = job.store()
    chain: list[int] = [resource]
    start: str | None = None
    below = [m for m in job.settings.milestones if m < resource]
    for m in reversed(below):  # the trial's earlier rungs: the milestones below it where it left a checkpoint
        local = _local(store, job.checkpoint_url(trial_id, m))
        if local is None:  # not one of its rungs (none left below its first: it began from scratch)
            continue
        if checkpoint_damage(local) is None:
            start = local
            break
        chain.insert(0, m)
    units, seconds, checkpoint = 0, 0.0, start
    for m in chain:
        trained = trainer.train(config, m, checkpoint, job.checkpoint_path(trial_id, m))
        checkpoint = trained.checkpoint
        store.publish(checkpoint)
        units, seconds = units + trained.resource_trained, seconds + trained.seconds
    origin = {"rebuilt_from": f"r={_resource_of(job, start)}"} if start else {}
    return replace(trained, resource_trained=units, seconds=seconds, info={**trained.info, **origin})


def _local(store: Any, url: str) -> str | None:
    """A local copy of a checkpoint in the job's storage; None when there is none."""
    try:
        local = store.fetch(url)
    except FileNotFoundError:
        return None
    return local if os.path.exists(local) else None


def _resource_of(job: Job, checkpoint: str) -> int:
    """The units a checkpoint holds, from its name (``.../r<resource><suffix>``): its sidecar may be the damage."""
    name = os.path.basename(checkpoint)
    suffix = registry.get(job.settings.model).checkpoint_suffix
    return int(name[1:len(name) - len(suffix)])


@task(name="evaluate", task_run_name="evaluate {trial_id} at r={resource}", cache_policy=NO_CACHE, persist_result=False)
@_marks_its_errors
def evaluate_trial(job: Job, trainer: Trainer, trial_id: str, resource: int, trained: TrainResult) -> Evaluation:
    """The validation metric of a checkpoint, on the whole validation set; with several objectives, each of them
    (the costs measured here: the rung's training seconds, the checkpoint's bytes, the trainer's prediction ms)."""
    began = time.perf_counter()
    local = job.store().fetch(trained.checkpoint)
    value, measured = trainer.measure(local, trained.model)  # the metric, what else it measures (``predict_ms``)
    if not job.objectives:
        return Evaluation(value, time.perf_counter() - began)
    figures = {"train_seconds": trained.seconds, "model_bytes": float(size_of(local)), **measured, job.metric_key: value}
    return Evaluation(job.score_of(figures), time.perf_counter() - began, figures)


@task(name="promote", task_run_name="promote bracket s={s} rung {rung}", cache_policy=NO_CACHE)
def promote_rung(s: int, rung: int, resource: int, promoted: list[str], stopped: list[str]) -> list[str]:
    """A rung of bracket s closed (the scheduler ranked it): the top ⌊n_i/η⌋, ``promoted``, go up from ``resource``
    units, ``stopped`` end there. Its task run puts the decision in the job's DAG in the Prefect UI."""
    return promoted
