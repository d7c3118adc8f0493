"""MLflow's records of a job's trials: each write retried (``retrying``: a tracking server may blip mid-job), the
trials' child runs, their results and their close. Plain calls from the job's MLflow writer (``tracking.writer``),
no Prefect; the job's parent run and the writes of its end are Prefect tasks (``tasks.record``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from prefect_hyperband.common.errors import first_line
from prefect_hyperband.hyperband.promotion import failed
from prefect_hyperband.tracking import datasets, service_wait
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.trainers import registry

if TYPE_CHECKING:
    from prefect_hyperband.executors.job import Job
    from prefect_hyperband.executors.result import Outcome
    from prefect_hyperband.hyperband.scheduler import TrialRecord

T = TypeVar("T")
#: the one retry policy of every MLflow write (``retrying``; the end of the job's writes are tasks that call it,
#: ``write_end``): a tracking server may blip mid-job; past these the write fails (the loop's
#: ORCHESTRATION_RETRIES then re-run a trial-rung, or the job stops when the server did not answer)
DELAYS = (1.0, 5.0, 15.0)

def dataset_inputs(job: Job) -> list[Any]:
    """The job's training and validation data as MLflow dataset inputs; none for a user's own code, or when the data
    cannot be read here (a run without its inputs is better than a trial without its run)."""
    try:
        return datasets.inputs(job.settings.data if registry.get(job.settings.model).reads_data else None)
    except Exception as why:  # noqa: BLE001
        logging.getLogger(__name__).warning("MLflow dataset inputs left out: %s: %s", type(why).__name__, why)
        return []


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
                   best: tuple[int, float] | None = None) -> dict[str, str] | None:
    """A trial-rung's result on its trial's run, in one batch at step = its resource (``Outcome.batch``: the metric,
    what the trainer recorded on the way, a remote worker's tag), with the run's ``params`` when it is its first
    write and the trial's ``best`` so far (resource, value) as ``best_<metric>`` and its ``BEST_RESOURCE`` tag.
    A result at R with a score completes its trial whatever the scheduler: its close's tags (``close_tags``) go in
    the same batch, and are returned, so the close only ends the run (one write fewer per completed trial)."""
    history, metrics, tags = out.batch(job.metric_key)
    if best is not None:  # the runs table sorted by it agrees with the job's best (``promotion.best_rung``)
        metrics[f"best_{job.metric_key}"] = best[1]
        tags[BEST_RESOURCE] = str(best[0])
    rung = out.trial_rung
    closing = (close_tags(rung.rung, rung.resource, "completed")
               if out.error is None and rung.resource >= job.max_resource and not failed(out.score) else None)
    tags.update(closing or {})
    retrying(tracking.log_result, job.tracking_uri, run_id, history, metrics, out.trial_rung.resource, params,
             tags or None)
    return closing


def close_tags(rung: int, resource: int, status: str, error: str | None = None) -> dict[str, str]:
    """The tags a trial's run ends with: its highest rung, the resource it reached, its fate (and error)."""
    tags = {"hyperband.highest_rung": str(rung), "hyperband.resource": str(resource), "hyperband.status": status}
    if error:
        tags["hyperband.error"] = error[-4000:]
    return tags


#: runs a tracking server ends at once (each run's two writes stay in order) when a call ends at least
#: ``CLOSE_AT_ONCE_FROM`` of them: ending 7,000 runs one by one over HTTP took 13 minutes after a 10,000-trial-rung
#: job's last result (its end closes them in calls of ``tasks.tracker.CLOSE_CHUNK``, 100)
CLOSE_THREADS = 8
#: fewer than this (a rung's close ends a few runs, every few seconds): one at a time. Twenty jobs sharing one
#: server, each ending every rung's runs eight at once, stalled it for tens of seconds at a time
#: (``benchmarks/bench_load.py --jobs 20``: 569 s a job and MLflow's p99 29.7 s, against 196 s and 0.44 s)
CLOSE_AT_ONCE_FROM = 50


def close_trial_runs(job: Job, trials: list[TrialRecord], runs: dict[str, str],
                     tagged: dict[str, dict[str, str]] | None = None) -> None:
    """Status tags of trials whose fate is known (stopped, failed, completed); their runs (``runs``: trial id ->
    run id) end: against a tracking server, ``CLOSE_THREADS`` runs at once when there are ``CLOSE_AT_ONCE_FROM`` or
    more (a local store takes one writer). ``tagged``: trial id -> the close tags its run already has (written
    with its result at R, ``log_trial_rung``): the same are not written again."""
    open_runs = [(t, runs[t.trial_id]) for t in trials if t.trial_id in runs]
    tagged = tagged or {}
    if len(open_runs) >= CLOSE_AT_ONCE_FROM and str(job.tracking_uri).startswith(("http://", "https://")):
        with ThreadPoolExecutor(min(CLOSE_THREADS, len(open_runs)), thread_name_prefix="hyperband-close") as pool:
            for done in [pool.submit(_close_run, job, t, run_id, tagged.get(t.trial_id)) for t, run_id in open_runs]:
                done.result()  # the first failure, past its retries, is the caller's
        return
    for t, run_id in open_runs:
        _close_run(job, t, run_id, tagged.get(t.trial_id))


def _close_run(job: Job, t: TrialRecord, run_id: str, tagged: dict[str, str] | None = None) -> None:
    tags = close_tags(t.rung, t.resource, t.status, t.error)
    if tags != tagged:
        retrying(tracking.set_tags, job.tracking_uri, run_id, tags)
    if t.status != "running":
        retrying(tracking.end_run, job.tracking_uri, run_id, "FAILED" if t.status == "failed" else "FINISHED")
