"""How a job ends: after its last result, the end written (open runs ended, the champion, importance, the reports
and the summary on the parent run), or, stopped, its runs ended and its state kept for ``--resume``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.states import Cancelled, Failed, State
from prefect.utilities.annotations import quote

from prefect_hyperband.common.errors import first_line, shown
from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.loop import Drive, JobStopped
from prefect_hyperband.flows import objectives, parents
from prefect_hyperband.flows.lost import end_orphan_runs
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.hyperband import front
from prefect_hyperband.hyperband.accounting import RungResult, Summary, summarise, table
from prefect_hyperband.hyperband.importance import Importance
from prefect_hyperband.hyperband.promotion import Score, first
from prefect_hyperband.hyperband.scheduler import TrialRecord, best_of
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.front_report import log_front
from prefect_hyperband.tasks.importance_report import log_importance
from prefect_hyperband.tasks.record import (
    FULL,
    cut_short,
    ends_the_job,
    finish_job_run,
    keep_best_checkpoint,
    outage,
    reason,
    register_champion,
    retrying,
)
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking import store as mlflow_store
from prefect_hyperband.tracking.champion import Registered
from prefect_hyperband.trainers import registry


def finish(params: TuneParams, job: Job, records: list[TrialRecord], run, runs: dict[str, str], max_trials: int,
           progress, logger) -> dict[str, Any] | State:
    """The job's end (``_finish``); MLflow gone after the last result, or a full disk under it, stops the job in one
    line (exit 75): every result is saved, and ``--resume`` writes the end."""
    try:
        result = _finish(params, job, records, run, runs, max_trials, progress, logger)
    except Exception as exc:
        if not isinstance(exc, _CutShort) and not ends_the_job(exc):
            raise
        kind, what, where = outage(exc.args[0] if isinstance(exc, _CutShort) else exc, params.service_wait,
                                   job.tracking_uri)
        why = exc.args[1] if isinstance(exc, _CutShort) else reason(exc)
        then = "free space, then " if kind == FULL else ""
        message = (f"job {job.job_id} stopped: {what} while the job's end was written {where}: {why}; every result "
                   f"is saved: {then}--resume {job.job_id} writes its summary and model")
        logger.warning("%s", message)
        return Cancelled(message=message)  # a Python caller of the flow gets CancelledRun(message)
    if result["every_trial_failed"]:  # nothing tuned: the flow run Failed (its end written, the result kept on it)
        return Failed(message=f"every trial failed ({result['summary']['failed_trials']}), the first with "
                              f"{result['every_trial_failed']}", data=result)
    return result


def every_trial_failed(state: State) -> dict[str, Any] | None:
    """The result of a job whose every trial failed (its flow run Failed, its end written as any job's), else None."""
    if not state.is_failed():
        return None
    result = state.result(raise_on_failure=False)
    return result if isinstance(result, dict) and result.get("every_trial_failed") else None


class _CutShort(Exception):
    """A task of the job's end failed on MLflow not answering or a full disk: (kind, line), ``record.cut_short``."""


def _written(job: Job, state: State) -> Any:
    """A task of the job's end: its result, or ``_CutShort`` when MLflow did not answer or its disk is full."""
    cut = cut_short(job, state)
    if cut is not None:
        raise _CutShort(*cut)
    return state.result()


def _finish(params: TuneParams, job: Job, records: list[TrialRecord], run, runs: dict[str, str], max_trials: int,
            progress, logger) -> dict[str, Any]:
    """The job's end, after its last result: open runs ended, the champion, importance, reports, the summary."""
    if run.stopped_by:
        _pause_open_runs(job, records, runs, run.stopped_by)
    end_orphan_runs(job, records, runs, logger)
    points = front.points(records, job.directions) if job.objectives else []  # several objectives: the front, once
    failed = _every_trial_failed(records)
    summary, best = _summarise(job, records, run, runs, points)
    registered = _champion(params, job, best, logger)
    version = registered.version if registered is not None else None
    # quoted: Prefect walks a task run's parameters for futures, and walking a 960-trial job's records took seconds
    mattered = None if params.importance == "none" else _written(job, log_importance(
        quote(job), quote(records), params.importance, return_state=True))
    progress.finish()
    links = mlflow_links(job, registered)
    report.report_results(
        [RungResult(**r) for r in run.rows], {t.trial_id: t.config for t in records}, summary, job.metric_key,
        job.direction, job.tracking_uri, job.parent_run_id, title=f"Hyperband job {job.job_id}",
        extra={name: f"[{text}]({url})" if mlflow_store.on_server(url) else f"{text}: {url}"
               for name, (text, url) in links.items()}, runs=runs,
    )
    if job.objectives:
        _written(job, log_front(quote(job), quote(records), quote(run.rows), quote(runs),
                                 best["trial_id"] if best else None, quote(points), return_state=True))
    overall = parents.overall_best(job, best)
    text = _summary_text(job, summary, run, len(records), max_trials, params.time_budget, mattered, points, best)
    if registered is not None:  # champion kept or moved, and why (``champion.decide``)
        text += "\n" + registered.line
    if overall is not None:
        text += "\n" + _overall_line(job, overall)
    metrics = _job_metrics(job, summary, run.elapsed)
    if overall is not None:
        metrics[f"overall_best_{job.metric_key}"] = overall["score"]
    _written(job, finish_job_run(job, metrics, _best_config(job, best), summary.to_json(), text, len(run.rows),
                                  "FAILED" if failed else "FINISHED", return_state=True))
    logger.info("summary\n%s", text, extra={"hyperband_terminal": False})  # the CLI prints it once
    for name, (said, url) in links.items():  # the run's last lines: where it is in MLflow (the CLI says it its way)
        logger.info("%s: %s, %s", name, said, url, extra={"hyperband_terminal": False})
    return {
        "job_id": job.job_id,
        "job_dir": job.job_dir,
        "storage": job.store().root,
        "parent_run_id": job.parent_run_id,
        "direction": job.direction,
        "summary": summary.to_json(),
        "table": text,
        "best": best,
        "champion_version": version,  # this job's registered version, whichever alias it took
        "model_alias": registered.alias if registered is not None else None,
        "stopped_by": run.stopped_by,
        "warm_start": {k: job.warm[k] for k in ("parents", "kind", "note")} if job.warm else None,
        "overall_best": overall,
        "every_trial_failed": failed,
    }


def mlflow_links(job: Job, registered: Registered | None) -> dict[str, tuple[str, str]]:
    """Where the job is in MLflow's model-training view: its parent run's page and its registered version's (on a
    tracking server), or the command that serves a local store; each a (text, link)."""
    links = {"MLflow parent run": (job.parent_run_id or "", mlflow_store.run_page(job.tracking_uri, job.parent_run_id))}
    if registered is not None:
        page = mlflow_store.version_page(job.tracking_uri, job.experiment, registered.version)
        links["registered model"] = (f"{job.experiment} version {registered.version} (@{registered.alias})",
                                     page or f"models:/{job.experiment}/{registered.version}")
    return links


def _every_trial_failed(records: list[TrialRecord]) -> str | None:
    """When no trial of the job gave a result, every one failing: the first one's error (the user's code, most
    often, or its data), for the CLI's one line; else None."""
    if not records or any(t.status != "failed" for t in records):
        return None
    first = next((t for t in records if t.error), records[0])
    return f"{first.trial_id}: {shown(first_line(first.error or 'no error recorded'))}"


def _overall_line(job: Job, overall: dict[str, Any]) -> str:
    """The best of this job and the jobs it started from (same data and space), as SageMaker reports it."""
    whose = "this job's" if overall["job_id"] == job.job_id else f"job {overall['job_id']}'s"
    return (f"overall best of this job and {', '.join(job.warm['parents'])} (same data and space): {job.metric_key} "  # type: ignore[index]
            f"{overall['score']:.4f}, {whose} {overall['trial_id']} at r={overall['resource']}")


def _summary_text(job: Job, summary: Summary, run, configs: int, max_trials: int, time_budget: float | None,
                  mattered: Importance | None, points: list[front.Point], best: dict[str, Any] | None) -> str:
    """The summary the CLI prints and the parent run keeps: the cost/gain table, then what else the job tells."""
    text = table(summary)
    if job.mode == "asha":
        text += "\n" + asha_line(configs, max_trials, time_budget, run.elapsed)
    if job.warm:
        text += "\n" + job.warm["note"]
    if mattered is not None:
        text += "\n" + mattered.line()
    if run.stopped_by:
        text += f"\nstopped before the schedule's end: {run.stopped_by} (--resume {job.job_id} with a looser criterion goes on)"
    if job.objectives:  # the front under the summary
        names = [name for name, _ in job.objectives]
        text += "\n" + front.table(points, names, job.directions, best["trial_id"] if best else None)
    return text


def _pause_open_runs(job: Job, records, runs: dict[str, str], why: str) -> None:
    """A criterion ended the job: the runs of trials still waiting in a rung end (a resume goes on with them)."""
    retrying(tracking.set_tags, job.tracking_uri, job.parent_run_id, {"hyperband.stopped_by": why})
    for t in records:
        if t.status == "running" and t.trial_id in runs:
            retrying(tracking.set_tags, job.tracking_uri, runs[t.trial_id], {"hyperband.status": "paused"})
            retrying(tracking.end_run, job.tracking_uri, runs[t.trial_id], "FINISHED")


def _champion(params: TuneParams, job: Job, best: dict[str, Any] | None, logger) -> Registered | None:
    """The best model registered, aliased champion when it beats the current one, else challenger (its version, alias
    and line: ``champion.decide``), or its checkpoint on the parent run (None)."""
    if best is None:
        return None
    got, why = None, "registration off" if not params.register_model else "the model has no MLflow flavour"
    best_file = job.store().fetch(best["checkpoint"])  # local, wherever it was trained
    if params.register_model and registry.get(job.settings.model).log_model is not None:
        state = register_champion(job, best["run_id"], best_file, _champion_metrics(job, best), best["resource"],
                                  params.force_champion, return_state=True)
        if state.is_completed():
            got = state.result()  # None: the model logged nothing (a user's code without log_model)
        elif cut_short(job, state) is not None:
            raise _CutShort(*cut_short(job, state))
        else:  # the results stand without a registered model: say so, keep the job
            why = "its registration failed"
            logger.error("could not register the champion model: %s", state.message)
    if got is None:  # no flavour to log it in: its files, on the parent run
        _written(job, keep_best_checkpoint(job, best_file, return_state=True))
        logger.info("no model registered (%s); the best checkpoint is on the parent run under best_checkpoint/", why)
    return got


def _job_metrics(job: Job, summary: Summary, wall: float) -> dict[str, Any]:
    """The parent run's metrics: the summary's figures."""
    return {
        f"best_{job.metric_key}": summary.best_score,
        f"default_{job.metric_key}": summary.default_score,
        "configs": summary.configs,
        "resource_used": summary.resource_used,
        "resource_without_early_stopping": summary.resource_without_early_stopping,
        "worker_seconds": summary.worker_seconds,
        "gpu_seconds": summary.gpu_seconds,
        "lost_worker_seconds": summary.lost_worker_seconds,
        "worker_seconds_without_early_stopping": summary.worker_seconds_without_early_stopping,
        "wall_seconds": wall,
        "sequential_seconds": summary.sequential_seconds,
        "failed_trials": summary.failed_trials,
    }


def _best_config(job: Job, best: dict[str, Any] | None) -> dict[str, Any]:
    if not best:
        return {}
    return {"trial_id": best["trial_id"], "resource": best["resource"], job.metric_key: best["score"], "config": best["config"]}


def stopped(job: Job, scheduler, runs: dict[str, str], stop: JobStopped, logger) -> State:
    """The job stopped on request: open runs end KILLED, the flow run ends Cancelled; ``--resume`` finishes it. A job
    stopped because a server did not answer leaves its MLflow runs open (each write would wait minutes more)."""
    message = f"job {job.job_id} {stop}{_space_needed(job, scheduler, stop)}; resume with --resume {job.job_id}"
    if (stop.reason or "").startswith("a server did not answer"):
        logger.warning("%s (MLflow runs left open: --resume ends them)", message)
        return Cancelled(message=message)  # a Python caller of the flow gets CancelledRun(message)
    open_runs = [runs[t.trial_id] for t in scheduler.records() if t.status == "running" and t.trial_id in runs]
    for run_id in [*open_runs, job.parent_run_id]:
        try:
            tracking.end_run(job.tracking_uri, run_id, "KILLED")
        except Exception as exc:  # a resume ends them again
            logger.warning("MLflow: could not end run %s: %s", run_id, exc)
    if job.parent_run_id:
        try:
            tracking.set_tags(job.tracking_uri, job.parent_run_id, {"hyperband.stopped": str(stop)})
        except Exception as exc:  # noqa: BLE001  (a full disk under the store: the stop line says why)
            logger.warning("MLflow: could not tag run %s: %s", job.parent_run_id, exc)
    logger.warning("%s (%d MLflow runs ended KILLED)", message, len(open_runs) + 1)
    return Cancelled(message=message)  # a Python caller of the flow gets CancelledRun(message)


def _space_needed(job: Job, scheduler, stop: JobStopped) -> str:
    """After a full disk: what the job's folder holds per trial-rung so far (measured), the space each needs."""
    if not (stop.reason or "").startswith("no space left"):
        return ""
    done = sum(len(t.scores) for t in scheduler.records())
    size = sum(f.stat().st_blocks * 512 for f in Path(job.job_dir).rglob("*") if f.is_file())  # as allocated
    if not done:
        return ""
    return f"; the job folder holds {size / 2**20:,.2f} MiB for {done} trial-rungs (about {size / done / 2**10:,.1f} KiB each)"


def _summarise(job: Job, records: list[TrialRecord], run: Drive, runs: dict[str, str],
               points: list[front.Point]) -> tuple[Summary, dict | None]:
    """The job's summary and its champion; ``points``: the front of several objectives (empty with one metric)."""
    found = champion(job, records, points)
    best = None
    if found is not None:
        t, resource, value = found
        best = {"trial_id": t.trial_id, "resource": resource, "score": first(value), "config": t.config,
                **({"values": list(value)} if isinstance(value, tuple) else {}),
                "run_id": runs.get(t.trial_id), "checkpoint": job.checkpoint_url(t.trial_id, resource), "bracket": t.bracket}
    summary = summarise(
        [RungResult(**r) for r in run.rows],
        metric=job.metric_key,  # the metric's one name: MLflow's, the leaderboard's, the summary's, the plots'
        configs=len(records),
        max_resource=job.max_resource,
        reached_max_resource=sum(1 for t in records if t.status == "completed"),
        failed_trials=sum(1 for t in records if t.status == "failed"),
        best=(best["trial_id"], best["resource"], best["score"]) if best else None,
        default_score=run.default_score,
        wall_seconds=run.elapsed,
        concurrency=job.concurrency,
        lost_worker_seconds=run.lost,
        baseline=None if run.baseline is None else RungResult(**run.baseline),
    )
    if job.objectives:
        summary = replace(summary, objectives=tuple(name for name, _ in job.objectives),
                          front_size=sum(p.front == 0 for p in points))
    return summary, best


def _champion_metrics(job: Job, best: dict[str, Any]) -> dict[str, float]:
    """The champion's metric (and each objective) at the resource it was chosen at, to link to its logged model."""
    if not job.objectives or not isinstance(best.get("values"), (tuple, list)):
        return {job.metric_key: best["score"]}
    return {name: float(v) for (name, _), v in zip(job.objectives, best["values"])}


def champion(job: Job, records: list[TrialRecord], points: list[front.Point]) -> tuple[TrialRecord, int, Score] | None:
    """The trial, resource and score to register: the best seen (one metric); of several objectives, the point of
    the Pareto front (``points``) that ``--select`` picks."""
    if not job.objectives:
        return best_of(records, job.direction)
    on_front = [p for p in points if p.front == 0]
    names = [name for name, _ in job.objectives]
    chosen, note = front.choose(on_front, job.directions, names, objectives.parse_select(job.select))
    if note:
        get_run_logger().warning("--select %s: %s", job.select, note)
    if chosen is None:
        return None
    return next(t for t in records if t.trial_id == chosen.trial_id), chosen.resource, chosen.values


def asha_line(configs: int, max_trials: int, time_budget: float | None, elapsed: float) -> str:
    """Under an ASHA job's summary: how far it went against its limits."""
    budget = ""
    if time_budget:
        budget = f"; time budget {time_budget:g} s, {'spent' if elapsed >= time_budget else f'{elapsed:,.1f} s used'}"
    return f"asha: {configs:,} of at most {max_trials:,} configs started{budget}"
