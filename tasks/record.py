"""The Prefect tasks that write the job's end to MLflow (its parent run's close, the best checkpoint, the champion),
each write retried (``tracking.records.retrying``), and how a job cut short by a lost service says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from prefect_hyperband.common.errors import causes, first_line, no_space, unavailable
from prefect_hyperband.executors.job import Job
from prefect_hyperband.tracking import champion, datasets
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking.records import dataset_inputs, retrying
from prefect_hyperband.trainers import factory, registry

T = TypeVar("T")
#: the tasks of the job's end: no retries of Prefect's (each would wait MLflow's client's whole bound again)
END = dict(retries=0, cache_policy=NO_CACHE)  # 0 whatever PREFECT_TASK_DEFAULT_RETRIES says


def start_job_run(job: Job, params: dict[str, Any], nest_under: str | None = None, within: float | None = None) -> str:
    """The job's parent run, with its dataset inputs, in an experiment of MLflow's model development kind whose
    primary metric is the job's (the first objective's). A plain call, retried (``retrying``) for at most ``within``
    seconds (``--service-wait``): a server that does not answer stops the job before anything ran, in one line,
    where a failed task would print its traceback (``flows.tune._start``)."""
    return retrying(_start_job_run, job, params, nest_under, within=within)


def _start_job_run(job: Job, params: dict[str, Any], nest_under: str | None) -> str:
    tags = {"hyperband.job_id": job.job_id, "hyperband.job_dir": job.job_dir, "hyperband.metric": job.metric}
    if nest_under:  # a job of a scaling study: its parent run sits under the study's run
        tags["mlflow.parentRunId"] = nest_under
    model = registry.get(job.settings.model)
    if model.reads_data and not model.user_code:
        tags.update(datasets.lineage_tags(job.settings.data))  # where its data lives, and its listing's digest
    _, note = tracking.model_development(job.tracking_uri, job.experiment, job.metric_key, job.direction == "max")
    if note:
        get_run_logger().warning(note)
    return tracking.start_parent(job.tracking_uri, job.experiment, f"hyperband-{job.job_id}", params, tags,
                                 dataset_inputs(job))


def write_end(job: Job, fn: Callable[..., T], *args: Any, retries_its_writes: bool = False) -> T | State:
    """A write of the job's end (a task's body), tried as every MLflow write is (``retrying``; by ``fn`` itself
    where ``retries_its_writes``). MLflow not answering past that, or a full disk under it, is the task's ``Failed``
    state with one line, no traceback (``cut_short``); the flow stops the job on it, its results saved, and
    ``--resume`` writes the end again. Any other error is the task's own."""
    try:
        return fn(*args) if retries_its_writes else retrying(fn, *args)
    except Exception as exc:
        if not ends_the_job(exc):
            raise
        kind = FULL if no_space(exc) else GONE
        return Failed(message=f"{CUT_SHORT}{job.tracking_uri} ({kind}): {reason(exc)}")


def reason(exc: BaseException) -> str:
    """An MLflow error in a line: what urllib3 said it gave up on (``Caused by ...``), else the error's first line
    (an MLflow error's first line is mostly the request's URL)."""
    text = str(exc)
    at = text.rfind("(Caused by ")
    if at >= 0:
        return first_line(text[at + len("(Caused by "):].removesuffix(")").removesuffix(")") + ")")
    return first_line(exc) or type(exc).__name__


#: the line of a task of the job's end that MLflow cut short (``write_end``), and the two ways it can
CUT_SHORT, FULL, GONE = "the job's end could not be written to MLflow at ", "no space left", "no answer"


def ends_the_job(exc: BaseException) -> bool:
    """MLflow did not answer past its client's retries, or a disk under it is full: at the job's end, the job stops
    (exit 75, every result saved) rather than finishing without its summary or its model."""
    return unavailable(exc) or no_space(exc)


def outage(cause: BaseException | str, service_wait: float, tracking_uri: str) -> tuple[str, str, str]:
    """The service that stopped a job (or a scaling study), for its one line: (kind, what, where). ``cause`` is the
    error, or the kind a task of the job's end was cut short with (``cut_short``). A full disk; Prefect's API not
    answering (the error came from its client: httpx, not MLflow's requests); else MLflow past ``--service-wait``."""
    kind = cause if isinstance(cause, str) else FULL if no_space(cause) else PREFECT if from_prefect(cause) else GONE
    if kind == FULL:
        return kind, "no space left on device", f"to MLflow at {tracking_uri}"
    if kind == PREFECT:
        return kind, "Prefect's API did not answer", f"through Prefect's API at {prefect_api()}"
    return kind, f"MLflow did not answer within {service_wait:g} s (--service-wait)", f"to MLflow at {tracking_uri}"


#: a third way a job stops under a lost service (``outage``): Prefect's own API, not MLflow
PREFECT = "Prefect's API"


def from_prefect(exc: BaseException) -> bool:
    """The error came from Prefect's client (``httpx``), not MLflow's (``requests``, ``urllib3``)."""
    return any(type(e).__module__.split(".")[0] in ("httpx", "httpcore", "prefect") for e in causes(exc))


def prefect_api() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or "(this process's temporary server)"


def cut_short(job: Job, state: State) -> tuple[str, str] | None:
    """How and why a task of the job's end was cut short (``write_end``): ``FULL`` or ``GONE``, its error's line."""
    message = state.message or ""
    for kind in (FULL, GONE):
        said = f"{CUT_SHORT}{job.tracking_uri} ({kind}): "
        if state.is_failed() and message.startswith(said):
            return kind, message[len(said):]
    return None


@task(name="finish parent run", **END)
def finish_job_run(job: Job, metrics: dict[str, float], best_config: dict[str, Any], summary: dict[str, Any],
                   table: str, step: int = 0, status: str = "FINISHED") -> None | State:
    return write_end(job, _finish_job_run, job, metrics, best_config, summary, table, step, status)


def _finish_job_run(job: Job, metrics: dict[str, float], best_config: dict[str, Any], summary: dict[str, Any],
                    table: str, step: int = 0, status: str = "FINISHED") -> None:
    """The summary's files on the parent run, its ``metrics`` at ``step`` (the job's trial-rungs so far), the run
    ended with ``status`` (``FAILED`` when every trial failed). The metrics go in one batch, once per step: written again (MLflow went away before the run's end, and
    ``--resume`` writes the end again) they are not logged twice; a job resumed with a looser criterion that trained
    more logs its new figures at its new step."""
    assert job.parent_run_id is not None
    uri, run_id = job.tracking_uri, job.parent_run_id
    tracking.log_json(uri, run_id, best_config, "best_config.json")
    tracking.log_json(uri, run_id, summary, "summary.json")
    tracking.log_text(uri, run_id, table + "\n", "summary.txt")
    sentinel = next(iter(k for k, v in metrics.items() if v is not None), None)
    logged = sentinel is not None and any(
        m.step == step for m in tracking.client(uri).get_metric_history(run_id, sentinel))
    if not logged:  # one batch: all of them or none
        tracking.log_metrics(uri, run_id, metrics, step=step)
    tracking.end_run(uri, run_id, status)


@task(name="keep best checkpoint", **END)
def keep_best_checkpoint(job: Job, checkpoint: str) -> None | State:
    """A user trainer's best checkpoint directory (and its metrics file) as artifacts of the parent run."""
    return write_end(job, _keep_best_checkpoint, job, checkpoint)


def _keep_best_checkpoint(job: Job, checkpoint: str) -> None:
    assert job.parent_run_id is not None
    directory = Path(checkpoint).with_suffix("")
    if directory.is_dir():
        tracking.log_artifacts(job.tracking_uri, job.parent_run_id, str(directory), "best_checkpoint")
    tracking.log_artifacts(job.tracking_uri, job.parent_run_id, checkpoint, "best_checkpoint")


@task(name="register champion", **END)
def register_champion(job: Job, run_id: str, checkpoint: str, metrics: dict[str, float] | None = None,
                      resource: int = 0, force: bool = False) -> champion.Registered | None | State:
    """The best trial's model in its flavour, with ``metrics`` (its metric, its objectives) linked to it for the
    validation dataset, listed on the parent run, registered under the experiment's name with alias champion when
    it beats the current one (``champion.decide``; ``force``: always), else challenger."""
    return write_end(job, _register_champion, job, run_id, checkpoint, metrics, resource, force)


def _register_champion(job: Job, run_id: str, checkpoint: str, metrics: dict[str, float] | None,
                       resource: int, force: bool = False) -> champion.Registered | None:
    assert job.parent_run_id is not None
    model = registry.get(job.settings.model)
    validation = (lambda: datasets.mlflow_datasets(job.settings.data)[1]) if model.reads_data else None
    got = champion.log_champion(job.tracking_uri, run_id, model, lambda: factory.get(job.settings), checkpoint,
                                job.experiment, metrics, validation, job.parent_run_id, resource, job.job_id,
                                job.direction, force)  # once per job and model; the trainer built only to log it
    if got is None:
        return None
    tracking.set_tags(job.tracking_uri, job.parent_run_id, {"hyperband.champion_version": got.version,
                                                            "hyperband.model_alias": got.alias,
                                                            "hyperband.best_run_id": run_id,
                                                            "hyperband.champion_resource": resource})
    return got
