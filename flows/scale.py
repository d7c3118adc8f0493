"""The scaling study: the tuning job at each cluster size N, the naive transfer, and which N to use.

One MLflow study run (top level) holds, nested under it, each N's job (its parent run, with its trial
runs under that) and one ``transfer w=N`` run per N: the best configuration tuned at the smallest N,
trained unchanged to R at N workers (for torch the per-replica batch stays, so the global batch grows
with N; the learning rate as found). The table goes on the study run as ``scaling.json``/``scaling.txt``
and a plot. In Prefect: a ``hyperband-scale`` flow whose per-N jobs are ``hyperband-tune`` subflows.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Failed, State

from prefect_hyperband.executors.storage import Storage
from prefect_hyperband.flows.params import TuneParams, flat
from prefect_hyperband.flows.prepare import new_job_id, prepare
from prefect_hyperband.flows.tune import tune
from prefect_hyperband.hyperband import speedup
from prefect_hyperband.tasks.record import ends_the_job, outage, reason
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking import service_wait
from prefect_hyperband.tracking import store as mlflow_store
from prefect_hyperband.tracking.records import retrying
from prefect_hyperband.trainers import factory


@flow(name="hyperband-scale", flow_run_name=lambda: f"hyperband scale {time.strftime('%H:%M:%S')}")
def scale(params: TuneParams, workers: list[int], target_score: float | None = None,
          tolerance: float = 0.005) -> dict[str, Any] | State:
    """Tune ``params`` at each worker count in ``workers``; compare tuned and transferred scores, cost and speed.
    MLflow not answering within ``--service-wait`` (as each job waits for it), or a job of the study stopped short,
    ends the study ``Cancelled`` with one line (the CLI's exit 75); the jobs finished so far keep their runs."""
    sizes = sorted(set(int(n) for n in workers))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"workers must be a list of counts >= 1, got {workers}")
    study = params.job_id or new_job_id()
    uri = mlflow_store.tracking_uri(params.tracking_uri)
    try:
        with service_wait.bound_client_waits(params.service_wait):
            return _study(params, sizes, study, uri, target_score, tolerance)
    except _JobStopped as stopped:
        return Cancelled(message=f"scaling study {study} stopped: {stopped}")
    except _JobFailed as failed:
        return Failed(message=str(failed))
    except Exception as exc:
        if not ends_the_job(exc):
            raise
        _, what, where = outage(exc, params.service_wait, uri)
        return Cancelled(message=f"scaling study {study} stopped: {what} while its runs were written {where}: "
                                 f"{reason(exc)}; the jobs finished so far keep their runs, run the study again")


class _JobStopped(Exception):
    """A job of the study ended short (its one line)."""


class _JobFailed(Exception):
    """A job of the study failed (every trial did): its one line."""


def _study(params: TuneParams, sizes: list[int], study: str, uri: str, target_score: float | None,
           tolerance: float) -> dict[str, Any]:
    logger = get_run_logger()
    study_run = retrying(tracking.start_parent,
        uri, params.experiment, f"hyperband-scale-{study}",
        {"workers": ",".join(map(str, sizes)), "model": params.model, "min_resource": params.min_resource,
         "max_resource": params.max_resource, "eta": params.eta, "seed": params.seed, "tolerance": tolerance},
        {"hyperband.study": study},
    )
    jobs: dict[int, dict[str, Any]] = {}
    for n in sizes:
        logger.info("scaling study %s: the job at %d workers", study, n)
        sized = params.model_copy(update={"workers": n, "job_id": f"{study}-w{n}", "nest_under": study_run,
                                          "resume": False})
        state = tune(**flat(sized), return_state=True)
        if state.is_cancelled():
            raise _JobStopped(state.message)
        if state.is_failed():  # every trial failed (the user's code): no study to make of it
            raise _JobFailed(f"its job at {n} workers: {state.message}")
        jobs[n] = state.result()
    first = jobs[sizes[0]]
    best = first.get("best")
    direction: speedup.Direction = first["direction"]
    metric = first["summary"]["metric"]
    transferred = {n: transfer(params, n, f"{study}-w{n}-transfer", best["config"], uri, study_run)
                   if best else None for n in sizes}
    tuned_first = first["summary"]["best_score"]
    target = target_score if target_score is not None else speedup.default_target(tuned_first, direction)
    rows = []
    for n in sizes:
        s = jobs[n]["summary"]
        state = Storage(jobs[n]["storage"], jobs[n]["job_dir"]).read_json("state.json")
        rows.append(speedup.ScaleRow(
            workers=n, tuned_score=s["best_score"], transferred_score=transferred[n], worker_seconds=s["worker_seconds"],
            wall_seconds=s["wall_seconds"], time_to_target=speedup.time_to_target(state["rows"], target, direction),
        ))
    cheapest, fastest = speedup.choose(rows, direction, tolerance)
    text = speedup.table(rows, metric, cheapest, fastest, tolerance, target)
    result = {"study": study, "study_run_id": study_run, "metric": metric, "target": target,
              "rows": [r.to_json() for r in rows], "cheapest": cheapest, "fastest": fastest,
              "best_config": best["config"] if best else None, "table": text,
              "jobs": {str(n): jobs[n]["parent_run_id"] for n in sizes}}
    _record(uri, study_run, result, rows, metric)
    logger.info("scaling study %s\n%s", study, text, extra={"hyperband_terminal": False})
    return result


@task(name="transfer", task_run_name="transfer to {job_id}", cache_policy=NO_CACHE)
def transfer(params: TuneParams, n: int, job_id: str, config: dict[str, Any], uri: str, study_run: str) -> float | None:
    """``config`` (tuned at the smallest N) trained from scratch to R at ``n`` workers, unchanged; its score."""
    job = prepare(params.model_copy(update={"workers": n, "job_id": job_id, "resume": False}))
    with factory.scope() as trainers:
        return _transfer(job, trainers.get(job.settings), n, config, uri, study_run)


def _transfer(job, trainer, n: int, config: dict[str, Any], uri: str, study_run: str) -> float | None:
    run_id = retrying(tracking.create_child, uri, study_run, f"transfer w={n}", {"hyperband.transfer_workers": str(n)})
    try:
        began = time.perf_counter()
        trained = trainer.train(config, job.max_resource, None, job.checkpoint_path("transfer", job.max_resource))
        score = trainer.measure(trained.checkpoint)[0]
        retrying(tracking.log_result, uri, run_id, trained.history,
                 {job.metric_key: score, "train_seconds": trained.seconds,
                  "worker_seconds": trained.seconds * trained.workers,
                  "wall_seconds": time.perf_counter() - began}, job.max_resource, {**config, "workers": n})
        retrying(tracking.end_run, uri, run_id, "FINISHED")
        return score
    except Exception as exc:  # the study stands without this figure; say why on the run
        if ends_the_job(exc):  # MLflow gone: the study stops in one line
            raise
        retrying(tracking.set_tags, uri, run_id, {"hyperband.error": f"{type(exc).__name__}: {exc}"[-4000:]})
        retrying(tracking.end_run, uri, run_id, "FAILED")
        get_run_logger().warning("transfer to %d workers failed: %s", n, exc)
        return None


def _record(uri: str, run_id: str, result: dict[str, Any], rows: list[speedup.ScaleRow], metric: str) -> None:
    retrying(tracking.log_json, uri, run_id, {k: v for k, v in result.items() if k != "table"}, "scaling.json")
    retrying(tracking.log_text, uri, run_id, result["table"] + "\n", "scaling.txt")
    for r in rows:  # at step = N: MLflow charts them against the cluster size
        retrying(tracking.log_metrics, uri, run_id, {f"tuned_{metric}": r.tuned_score, f"transferred_{metric}": r.transferred_score,
                                           "worker_seconds": r.worker_seconds, "wall_seconds": r.wall_seconds,
                                           "time_to_target": r.time_to_target}, step=r.workers)
    try:
        from prefect_hyperband.tasks.report import figure

        fig = figure(9.0, 4.0)
        left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        ns = [r.workers for r in rows]
        left.plot(ns, [r.tuned_score for r in rows], "o-", label="tuned at N")
        left.plot(ns, [r.transferred_score for r in rows], "s--", label="tuned at smallest N, trained at N")
        left.set_xlabel("workers N")
        left.set_ylabel(metric)
        left.legend()
        right.plot(ns, [r.worker_seconds for r in rows], "o-", label="worker-seconds")
        right.plot(ns, [r.wall_seconds for r in rows], "s--", label="wall seconds")
        right.set_xlabel("workers N")
        right.legend()
        fig.tight_layout()
        retrying(mlflow_store.client(uri).log_figure, run_id, fig, "scaling.png")
    finally:
        retrying(tracking.end_run, uri, run_id, "FINISHED")
