"""Turn validated parameters into a ``Job``: everything checked here, before any training."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.flows.state import load_job_record
from prefect_hyperband.hyperband import schedule, space as spaces
from prefect_hyperband.hyperband.promotion import Direction
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.tracking import check_reachable, tracking_uri
from prefect_hyperband.trainers import data as datasets
from prefect_hyperband.trainers.errors import InputError
from prefect_hyperband.trainers.factory import TrainerSettings, model_space


def new_job_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def resume_params(job_dir: str, job_id: str) -> TuneParams:
    """The parameters a job was started with, for ``--resume``: same seed, same configs."""
    record = load_job_record(Path(job_dir).resolve() / job_id)
    if record is None:
        raise InputError(f"no job {job_id!r} to resume under {job_dir} (expected {job_id}/job.json)")
    return TuneParams(**{**record["params"], "job_dir": job_dir, "job_id": job_id, "resume": True})


def prepare(params: TuneParams) -> Job:
    """Validate the schedule, the search space, the data, the metric and the tracking store."""
    schedule.validate(params.min_resource, params.max_resource, params.eta)
    default_space, known, default_config = model_space(params.model)
    if isinstance(params.space, dict):
        space = spaces.parse(params.space, known, params.model)
    elif params.space:
        space = spaces.load(params.space, known, params.model)
    else:
        space = spaces.parse(default_space, known, params.model)
    spec = datasets.DataSpec(
        data=params.data,
        target=params.target,
        validation_fraction=params.validation_fraction,
        seed=params.seed,
    )
    if params.model == "function":  # the user's code reads its own data; the metric is theirs
        from prefect_hyperband.trainers.function import load as load_trainer

        load_trainer(params.trainer or "")  # a missing file, an import error, a wrong signature: fail now
        metric = params.metric or ""
        direction: Direction = "min" if params.direction == "minimize" else "max"
    elif params.model == "synthetic":
        from prefect_hyperband.trainers.synthetic import SyntheticTrainer

        metric = SyntheticTrainer.metric
        direction = datasets.metric_direction(metric)
    else:
        dataset = datasets.load(spec)
        metric = params.metric or dataset.default_metric
        datasets.check_metric(dataset, metric)
        direction = datasets.metric_direction(metric)
    uri = tracking_uri(params.tracking_uri)
    check_reachable(uri)
    concurrency = params.trial_concurrency()
    settings = TrainerSettings(
        model=params.model,
        data=spec,
        workers=params.workers,
        metric=metric,
        seed=params.seed,
        milestones=schedule.milestones(params.min_resource, params.max_resource, params.eta),
        dask_address=params.dask_address,
        threads=max(1, (os.cpu_count() or 1) // concurrency),
        rounds_per_unit=params.rounds_per_unit,
        nnodes=params.nnodes,
        rdzv_endpoint=params.rdzv_endpoint,
        trainer=params.trainer,
        extra=(("seconds_per_unit", params.unit_seconds),) if params.model == "synthetic" else (),
    )
    job_id = params.job_id or new_job_id()
    job_dir = Path(params.job_dir).resolve() / job_id
    parent_run_id = None
    if params.resume:
        record = load_job_record(job_dir)
        if record is None:
            raise InputError(f"no job {job_id!r} to resume under {params.job_dir}")
        parent_run_id = record.get("parent_run_id")
    job_dir.mkdir(parents=True, exist_ok=True)
    return Job(
        job_id=job_id,
        job_dir=str(job_dir),
        settings=settings,
        metric=metric,
        direction=direction,
        min_resource=params.min_resource,
        max_resource=params.max_resource,
        eta=params.eta,
        seed=params.seed,
        space=space.to_dict(),
        default_config=dict(default_config),
        tracking_uri=uri,
        experiment=params.experiment,
        concurrency=concurrency,
        mode=params.mode,
        sampler=params.sampler,
        parent_run_id=parent_run_id,
    )
