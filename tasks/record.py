"""Tasks that write to MLflow; retried, since a tracking server may blip mid-job."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from prefect_hyperband.common.errors import causes, first_line, no_space, unavailable
from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.result import Outcome
from prefect_hyperband.tracking import champion, datasets, service_wait
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.trainers import factory, registry

T = TypeVar("T")
#: the one retry policy of every MLflow write (``retrying``; the end of the job's writes are tasks that call it,
#: ``write_end``): a tracking server may blip mid-job; past these the write fails (the loop's
#: ORCHESTRATION_RETRIES then re-run a trial-rung, or the job stops when the server did not answer)
DELAYS = (1.0, 5.0, 15.0)
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


def dataset_inputs(job: Job) -> list[Any]:
    """The job's training and validation data as MLflow dataset inputs; none for a user's own code, or when the data
    cannot be read here (a run without its inputs is better than a trial without its run)."""
    try:
        return datasets.inputs(job.settings.data if registry.get(job.settings.model).reads_data else None)
    except Exception as why:  # noqa: BLE001
        logging.getLogger(__name__).warning("MLflow dataset inputs left out: %s: %s", type(why).__name__, why)
        return []


# ---- per trial: plain calls from the driver's worker threads (no task run per write), each retried


def retrying(fn: Callable[..., T], *args: Any, delays: tuple[float, ...] = DELAYS, within: float | None = None,
             **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, tried again after each of ``delays`` seconds: a tracking server may blip mid-job.
    ``within``: no try starts later than that many seconds after the first. A try that failed only after MLflow's
    client had itself retried for its whole bound (about ``--service-wait``, ``service_wait.bound_client_waits``)
    is the last: a write waits about ``--service-wait`` in all, not four times it; a quick blip is tried again."""
    began = time.monotonic()
    for delay in (*delays, None):
        tried = time.monotonic()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _say_if_pool_exhausted(exc)
            now, waited = time.monotonic(), service_wait.client_waits()
            if (delay is None or (within is not None and now - began + delay > within)
                    or (waited > 0 and now - tried >= waited)):
                raise
            time.sleep(delay)
    raise AssertionError("unreachable")


#: what an MLflow server whose database pool ran out answers (SQLAlchemy's QueuePool timeout, as a 400)
POOL_EXHAUSTED = "QueuePool limit of size"
_pool_said = threading.Event()


def _say_if_pool_exhausted(exc: BaseException) -> None:
    """The MLflow server's pool of database connections ran out: its ``log_batch`` holds one connection while it
    takes a second (MLflow 3's SQLAlchemy store), so a server process with more requests at once than its pool (5 +
    10 by default) stalls them all for SQLAlchemy's 30 s pool timeout. The write is tried again as any; the process
    says once what the server needs (docs/reliability.md, "Many jobs, one server pair")."""
    if POOL_EXHAUSTED in str(exc) and not _pool_said.is_set():
        _pool_said.set()
        logging.getLogger(__name__).warning(
            "the MLflow server's database pool is exhausted (%s); its writes wait 30 s each until it is set "
            "larger: start it with MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=40 (then 45 connections a server process)",
            first_line(exc)[:160])


def write_end(job: Job, fn: Callable[..., T], *args: Any) -> T | State:
    """A write of the job's end (a task's body), tried as every MLflow write is (``retrying``). MLflow not answering
    past that, or a full disk under it, is the task's ``Failed`` state with one line, no traceback (``cut_short``);
    the flow stops the job on it, its results saved, and ``--resume`` writes the end again. Any other error is the
    task's own."""
    try:
        return retrying(fn, *args)
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


def trial_params(job: Job, trial_id: str, bracket: int, config: dict[str, Any]) -> dict[str, Any]:
    """A trial's child-run params: its config and worker layout."""
    params = {**config, "workers": job.settings.workers, "trial_id": trial_id, "bracket": bracket}
    if "batch_size" in config:  # data parallel: each replica sees batch_size rows a step
        params.update(per_replica_batch_size=config["batch_size"],
                      global_batch_size=config["batch_size"] * job.settings.workers)
    return params


def start_trial_run(job: Job, trial_id: str, bracket: int, started: float | None = None) -> str:
    """The trial's nested child run (its params come with its first result: one write fewer)."""
    assert job.parent_run_id is not None
    tags = {"hyperband.bracket": str(bracket), "hyperband.trial_id": trial_id, "hyperband.status": "running"}
    return retrying(tracking.create_child, job.tracking_uri, job.parent_run_id, trial_id, tags, started,
                    dataset_inputs(job))


#: a trial run's tag: the resource at which its ``best_<metric>`` was reached
BEST_RESOURCE = "hyperband.best_resource"


def log_trial_rung(job: Job, run_id: str, out: Outcome, params: dict[str, Any] | None = None,
                   best: tuple[int, float] | None = None) -> None:
    """A trial-rung's result on its trial's run, in one batch at step = its resource (``Outcome.batch``: the metric,
    what the trainer recorded on the way, a remote worker's tag), with the run's ``params`` when it is its first
    write and the trial's ``best`` so far (resource, value) as ``best_<metric>`` and its ``BEST_RESOURCE`` tag."""
    history, metrics, tags = out.batch(job.metric_key)
    if best is not None:  # the runs table sorted by it agrees with the job's best (``promotion.best_rung``)
        metrics[f"best_{job.metric_key}"] = best[1]
        tags[BEST_RESOURCE] = str(best[0])
    retrying(tracking.log_result, job.tracking_uri, run_id, history, metrics, out.trial_rung.resource, params,
             tags or None)


#: runs a tracking server ends at once (each run's two writes stay in order) when a call ends at least
#: ``CLOSE_AT_ONCE_FROM`` of them: ending 7,000 runs one by one over HTTP took 13 minutes after a 10,000-trial-rung
#: job's last result (its end closes them in calls of ``tasks.tracker.CLOSE_CHUNK``, 100)
CLOSE_THREADS = 8
#: fewer than this (a rung's close ends a few runs, every few seconds): one at a time. Twenty jobs sharing one
#: server, each ending every rung's runs eight at once, stalled it for tens of seconds at a time
#: (``benchmarks/bench_load.py --jobs 20``: 569 s a job and MLflow's p99 29.7 s, against 196 s and 0.44 s)
CLOSE_AT_ONCE_FROM = 50


def close_trial_runs(job: Job, trials: list[TrialRecord], runs: dict[str, str]) -> None:
    """Status tags of trials whose fate is known (stopped, failed, completed); their runs (``runs``: trial id ->
    run id) end: against a tracking server, ``CLOSE_THREADS`` runs at once when there are ``CLOSE_AT_ONCE_FROM`` or
    more (a local store takes one writer)."""
    open_runs = [(t, runs[t.trial_id]) for t in trials if t.trial_id in runs]
    if len(open_runs) >= CLOSE_AT_ONCE_FROM and str(job.tracking_uri).startswith(("http://", "https://")):
        with ThreadPoolExecutor(min(CLOSE_THREADS, len(open_runs)), thread_name_prefix="hyperband-close") as pool:
            for done in [pool.submit(_close_run, job, t, run_id) for t, run_id in open_runs]:
                done.result()  # the first failure, past its retries, is the caller's
        return
    for t, run_id in open_runs:
        _close_run(job, t, run_id)


def _close_run(job: Job, t: TrialRecord, run_id: str) -> None:
    tags = {"hyperband.highest_rung": str(t.rung), "hyperband.resource": str(t.resource), "hyperband.status": t.status}
    if t.error:
        tags["hyperband.error"] = t.error[-4000:]
    retrying(tracking.set_tags, job.tracking_uri, run_id, tags)
    if t.status != "running":
        retrying(tracking.end_run, job.tracking_uri, run_id, "FAILED" if t.status == "failed" else "FINISHED")


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
