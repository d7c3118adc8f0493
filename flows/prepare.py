"""Turn validated parameters into a ``Job``: everything checked here, before any training."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from pathlib import Path
from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors import dask_groups
from prefect_hyperband.executors import storage as storages
from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.loop import stop_grace
from prefect_hyperband.executors.state import check_resumable, job_store, load_job_record
from prefect_hyperband.flows import parents
from prefect_hyperband.flows.lock import check_free
from prefect_hyperband.flows.params import TuneParams, may_change_on_resume
from prefect_hyperband.flows.say import in_run
from prefect_hyperband.flows.search_space import job_objectives, job_space
from prefect_hyperband.flows.worker_slots import slot_count, storage_name
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.tracking import inputs as mlflow_input
from prefect_hyperband.tracking.store import check_reachable, tracking_uri
from prefect_hyperband.trainers import data as datasets
from prefect_hyperband.trainers import gpus, registry
from prefect_hyperband.trainers.factory import TrainerSettings
from prefect_hyperband.trainers.tables import lineage_of


def _on_every_machine(path: str | None, pool: str | bool | None) -> str | None:
    """A relative file path (data, --trainer's file, --script) made absolute for a pool's workers, which run
    elsewhere (their own folder): the same path must hold the same file there. Names and modules stay as given."""
    if not pool or not path:
        return path
    file, sep, rest = path.partition(":") if path.count(":") == 1 and not os.path.exists(path) else (path, "", "")
    return str(Path(file).resolve()) + sep + rest if os.path.exists(file) else path


def new_job_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


#: what a resumed job may change; everything else would mix two grids or two searches
#: what a resume may change: the fields marked ``on_resume: may change`` (``params.may_change_on_resume``)
MAY_CHANGE_ON_RESUME = may_change_on_resume()


def job_root(job_dir: str, storage: str | None) -> str:
    """The folder that holds job folders: a local ``--storage`` is one; with a URL the local one is ``job_dir``."""
    return storage if storage and storages.is_local(storage) else job_dir



def resume_params(job_dir: str, job_id: str, given: dict[str, Any] | None = None) -> TuneParams:
    """The parameters a job was started with, for a resume: same seed, same configs.

    ``given`` are the parameters passed explicitly with the resume (flags, a deployment's or a Python
    call's); one that differs from the saved job is refused, naming both values, unless it is one a
    resume may change (``MAY_CHANGE_ON_RESUME``).
    """
    storage = (given or {}).get("storage")
    root = job_root(job_dir, storage)
    record = load_job_record(job_store(Path(root).resolve() / job_id, job_id, storage), in_run)
    if record is None:
        where = storage if storage and not storages.is_local(storage) else root
        hint = "" if storage else " (a job started with --storage needs it again to resume)"
        raise InputError(f"no job {job_id!r} to resume under {where} (expected {job_id}/job.json){hint}")
    # a field an older version saved and this one no longer has (nnodes, rdzv_endpoint) is dropped
    saved = {k: v for k, v in record["params"].items() if k in TuneParams.model_fields}
    given = dict(given or {})
    if "tracking_uri" not in given and record.get("tracking_uri"):  # the store it began in, wherever resumed from
        saved["tracking_uri"] = record["tracking_uri"]
    began_with = (record.get("facts") or {}).get("space")
    if saved.get("space") is None and given.get("space") is None and began_with and _has_gpu_space(saved.get("model")):
        saved["space"] = began_with  # its default space where it began (a GPU's or a CPU's), not this machine's
        given.pop("space", None)  # (a form's or a call's None: the default, the one it began with)
    for name, value in given.items():
        if name in MAY_CHANGE_ON_RESUME or name not in saved or value == saved[name]:
            continue
        raise InputError(f"job {job_id!r} was started with {name}={saved[name]!r}; resuming it with "
                         f"{name}={value!r} would mix two jobs: drop the flag, or start a new job")
    return TuneParams(**{**saved, **given, "job_dir": job_dir, "job_id": job_id, "resume": True})


def _has_gpu_space(model: str | None) -> bool:
    """Whether ``model``'s default space depends on the machine (``Model.gpu_space``)."""
    try:
        return registry.get(model).gpu_space is not None
    except Exception:  # noqa: BLE001  (a model no longer installed: the resume's preflight names it)
        return False


def resolve(params: TuneParams) -> TuneParams:
    """A resume's full parameters: the saved job's, with what the caller set explicitly checked against them."""
    if not params.resume or not params.job_id:
        return params
    return resume_params(params.job_dir, params.job_id, params.model_dump(mode="json", include=params.model_fields_set))


def prepare(params: TuneParams) -> Job:
    """Validate the schedule, the search space, the data, the metric and the tracking store."""
    model = registry.get(params.model)
    missing = registry.missing_extra(params.model, params.workers)  # torch not installed: one line, not an ImportError
    if missing:
        raise InputError(missing.replace("--model ", "model ") if model.user_code is None else missing)
    _check_run_settings(params, model)
    gpu_ids = _gpus(params, model)
    space, default_config = job_space(params, model, on_gpu=bool(gpu_ids) or params.device == "cuda")
    spec = spec_of(params)
    metric, direction, chosen = job_objectives(params, model, spec)
    concurrency = _concurrency(params, gpu_ids)
    settings = _settings(params, model, spec, metric, max(1, (os.cpu_count() or 1) // concurrency))
    if model.user_code:  # a trainer file that does not import, a script that is not a file: fail now, in one line
        model.build(dataclasses.replace(settings, dask_address=None)).close()  # the code, not the cluster (above)
    job_id = params.job_id or new_job_id()
    job_dir, store, record = _place(params, job_id)
    _check_data_unchanged(params, model, job_id, record)
    try:
        job = Job(
            job_id=job_id,
            job_dir=str(job_dir),
            settings=settings,
            metric=metric,
            direction=direction,
            objectives=chosen,
            select=params.select,
            min_resource=params.min_resource,
            max_resource=params.max_resource,
            eta=params.eta,
            seed=params.seed,
            space=space.to_dict(),
            default_config=dict(default_config),
            tracking_uri=_tracking(params, model, job_id, record),
            experiment=params.experiment,
            concurrency=concurrency,
            mode=params.mode,
            sampler=params.sampler,
            prior_first=params.prior_first,
            baseline=params.baseline and bool(default_config),
            parent_run_id=(record or {}).get("parent_run_id"),
            trial_timeout=params.trial_timeout,
            storage=None if store.local else store.root,
            trial_pool=params.trial_pool,
            task_workers=params.task_workers,
            task_storage=_task_storage(params),
            follow_workers=params.task_workers and not params.concurrency,
        )
        return parents.plan(job, params, record)  # --warm-start: the earlier jobs checked, what they give decided
    except Exception:
        with contextlib.suppress(OSError):  # refused: the folder made for it goes (an empty one only)
            job_dir.rmdir()
        raise


def spec_of(params: TuneParams) -> datasets.DataSpec:
    """The job's data as its trainers load it."""
    elsewhere = params.trial_pool or params.task_workers
    return datasets.DataSpec(data=_on_every_machine(params.data, elsewhere), target=params.target,
                             validation_fraction=params.validation_fraction, seed=params.seed)


def _check_data_unchanged(params: TuneParams, model, job_id: str, record: dict[str, Any] | None) -> None:
    """A resume whose data changed since the job began (its files' names, sizes, ETags or modification times, as
    ``job.json`` keeps them): one line, unless ``--allow-data-change``."""
    saved = ((record or {}).get("facts") or {}).get("data_lineage")
    if not params.resume or not saved or not model.reads_data or model.user_code:
        return

    now = lineage_of(params.data)
    if now and now["digest"] != saved["digest"] and params.allow_data_change and saved.get("features"):
        features = list(datasets.layout_of(spec_of(params)).feature_names)
        if features != saved["features"]:
            gone, new = sorted(set(saved["features"]) - set(features)), sorted(set(features) - set(saved["features"]))
            raise InputError(f"job {job_id!r}: its data's columns or categories changed since it began (new: "
                             f"{', '.join(new[:5]) or 'none'}; gone: {', '.join(gone[:5]) or 'none'}): its checkpoints "
                             "cannot continue on them, even with --allow-data-change; start a new job")
    if now and now["digest"] != saved["digest"] and not params.allow_data_change:
        raise InputError(f"job {job_id!r}: its data changed since it began ({saved['url']}: {saved['parts']} part(s) "
                         f"of {saved['bytes']:,} bytes then, {now['parts']} of {now['bytes']:,} now; digest "
                         f"{saved['digest']} -> {now['digest']}); resume with --allow-data-change to go on with the "
                         "data as it is now, or start a new job")


def _check_run_settings(params: TuneParams, model) -> None:
    """The environment's settings, the schedule and the local workers, before any work."""
    stop_grace()
    if params.trial_pool or params.task_workers:
        from prefect_hyperband.flows.task_workers import pickup_timeout
        from prefect_hyperband.flows.work_pool import heartbeat_timeout

        heartbeat_timeout()
        pickup_timeout()
    schedule.validate(params.min_resource, params.max_resource, params.eta)
    schedule.check_size(params.min_resource, params.max_resource, params.eta)
    cores = os.cpu_count() or 1
    if model.local_workers and params.workers > cores and not params.dask_address:
        raise InputError(f"--workers {params.workers} starts {params.workers} local worker processes per trial on a "
                         f"machine of {cores} cores; use at most {cores}, or --dask-address for a cluster")


def _tracking(params: TuneParams, model, job_id: str, record: dict[str, Any] | None) -> str:
    """The MLflow store, reachable; the registered model's name and the runs the job names checked in it. A resumed
    job's parent run must be there (a relative ``sqlite:///mlflow.db`` from another folder is another store)."""
    uri = mlflow_input.absolute(tracking_uri(params.tracking_uri))  # the same store from whatever folder, later too
    check_reachable(uri)
    if params.register_model and model.log_model is not None:
        mlflow_input.check_model_name(params.experiment)
    if params.nest_under and not params.resume:
        mlflow_input.check_run(uri, params.nest_under, f"--nest-under {params.nest_under}: no such MLflow run in {uri}")
    parent = (record or {}).get("parent_run_id")
    if params.resume and parent:
        began = record.get("tracking_uri")
        hint = (f"; it was started with {began}: resume with --tracking-uri {began}"
                if began and began != uri else "; resume with the --tracking-uri it was started with")
        mlflow_input.check_run(uri, parent, f"job {job_id!r}: its parent run {parent} is not in the MLflow store "
                                            f"{uri}{hint}")
    return uri


def _settings(params: TuneParams, model, spec: datasets.DataSpec, metric: str, threads: int) -> TrainerSettings:
    """What a trainer is built from (``trainers.factory``): the model, its data, its knobs."""
    return TrainerSettings(
        model=params.model,
        data=spec,
        workers=params.workers,
        metric=metric,
        seed=params.seed,
        milestones=schedule.milestones(params.min_resource, params.max_resource, params.eta),
        dask_address=params.dask_address,
        threads=threads,
        trainer=_on_every_machine(params.trainer, params.trial_pool or params.task_workers),
        timeout=params.trial_timeout,
        gpus=gpus.parse(params.gpus),
        device=params.device,
        deterministic=params.deterministic,
        script=_on_every_machine(params.script, params.trial_pool or params.task_workers),
        extra=model.extra(params),
    )


def _task_storage(params: TuneParams) -> str | None:
    """``--storage`` as every machine names it (a local path made absolute), for ``--task-workers`` only."""
    if not (params.task_workers and params.storage):
        return None

    return storage_name(params.storage)


def _gpus(params: TuneParams, model) -> tuple[int, ...] | None:
    """This machine's GPUs for the job's trial-rungs (``trainers.gpus.choose``: too few for a trial's ranks is one line,
    before any training); None where the trials run elsewhere (a trial pool's, the task workers' or Dask's hosts
    place them on theirs) or on no GPU."""
    if not model.gpus:
        if params.gpus is not None or params.device == "cuda":
            raise InputError(f"--gpus and --device cuda: model {params.model!r} trains on the CPU only")
        return None
    elsewhere = bool(params.trial_pool or params.task_workers or params.dask_address)
    if params.workers > 1 and not model.gpu_ranks and not elsewhere:  # its processes here train on the CPUs
        if params.gpus is not None or params.device == "cuda":
            raise InputError(f"--workers {params.workers}: model {params.model!r} trains on this machine's CPUs (a "
                             "local Dask cluster); on a GPU use --workers 1, or --dask-address of GPU workers")
        return None
    ids = gpus.choose(params.device, params.gpus, params.workers, on_dask=elsewhere)
    return None if elsewhere else ids


def _concurrency(params: TuneParams, gpu_ids: tuple[int, ...] | None = None) -> int:
    """Trial-rungs at once: given, the trial pool's limit (or one per online worker), the task workers' slots, one
    per set of ``workers`` GPUs here (at most), or from the cores."""
    if gpu_ids:
        slots = len(gpus.groups(gpu_ids, params.workers))
        return min(params.concurrency or slots, slots)
    if params.trial_pool and not params.concurrency:
        from prefect_hyperband.flows.work_pool import pool_concurrency

        return pool_concurrency(params.trial_pool)
    if params.task_workers and not params.concurrency:
        from prefect_hyperband.flows.task_workers import key_of

        return slot_count(key_of(_task_storage(params)))
    size = dask_groups.cluster_size(params.dask_address, params.workers) if params.dask_address else None
    return params.trial_concurrency(size)  # too few workers: one line, before any training


def _place(params: TuneParams, job_id: str) -> tuple[Path, Any, dict[str, Any] | None]:
    """The job's folder (made, and checked free), its store, and the record of the job a resume continues."""
    if params.storage:
        storages.check(params.storage)
    job_dir = Path(job_root(params.job_dir, params.storage)).resolve() / job_id
    if any(folder.exists() and not folder.is_dir() for folder in (job_dir, *job_dir.parents)):
        raise InputError(f"--job-dir {params.job_dir}: {job_dir} cannot be a folder: a file is in its path")
    store = job_store(job_dir, job_id, params.storage)
    record = None
    if params.resume:
        record = load_job_record(store, in_run)
        if record is None:
            raise InputError(f"no job {job_id!r} to resume under {store.root}")
        check_resumable(store, job_id)
    elif load_job_record(store, in_run) is not None:
        raise InputError(f"job {job_id!r} already exists under {params.job_dir}; continue it with --resume {job_id} "
                         "or choose another --job-id")
    if job_dir.is_dir():
        check_free(job_dir, job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    return job_dir, store, record
