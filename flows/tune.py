"""The tuning job: Hyperband brackets side by side (or ASHA), then the champion and the accounting."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled, State

from prefect_hyperband.flows import objectives, parents
from prefect_hyperband.flows.driver import JobStopped, close_decided, drive
from prefect_hyperband.flows.lost import end_lost_flow_run, end_orphan_runs
from prefect_hyperband.flows.prepare import prepare, resolve
from prefect_hyperband.flows.params import TuneParams, mlflow_params
from prefect_hyperband.flows.lock import job_lock, took_over
from prefect_hyperband.flows.process import job_lines_in_ui
from prefect_hyperband.flows.state import load_state, make_scheduler, save_job_record
from prefect_hyperband.hyperband import front, schedule
from prefect_hyperband.hyperband.accounting import Summary, RungResult, summarise, table
from prefect_hyperband.hyperband.criteria import Criteria
from prefect_hyperband.hyperband.importance import MIN_RESULTS, Importance
from prefect_hyperband.hyperband.promotion import Score, first
from prefect_hyperband.hyperband.scheduler import TrialRecord, best_of
from prefect_hyperband.tasks import importance_report, report, tracking
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.front_report import log_front
from prefect_hyperband.tasks.record import (
    finish_job_run, keep_best_checkpoint, register_champion, start_job_run,
)
from prefect_hyperband.tasks.writer import Writer, make_writer, writer_for
from prefect_hyperband.trainers import factory, registry
from prefect_hyperband.trainers.errors import first_line, unavailable


def _run_name() -> str:
    params = flow_run.parameters.get("params")
    params = params if isinstance(params, TuneParams) else TuneParams.model_validate(params or {})
    code = registry.get(params.model).user_code
    if code:
        return f"hyperband {os.path.basename(str(getattr(params, code)))}"
    if not registry.get(params.model).reads_data:  # a synthetic job reads no data set: its name names none
        return f"hyperband {params.model} ({params.mode})"
    return f"hyperband {params.model} on {params.data}"


#: job ids whose flow run began in this process (the CLI retries a job only while Prefect could not start it)
bodies_begun: set[str] = set()


@flow(name="hyperband-tune", flow_run_name=_run_name)
def tune(params: TuneParams) -> dict[str, Any]:
    """Hyperband (Li et al., JMLR 2018) or ASHA (Li et al., MLSys 2020) over ``params``, tracked in MLflow."""
    if params.job_id:
        bodies_begun.add(params.job_id)
    logger = get_run_logger()
    began = time.perf_counter()
    params = resolve(params)  # a resume takes the saved parameters; a conflicting one is refused
    tracking.bound_client_waits(params.service_wait)  # before the writer's process starts: it inherits the bound
    job = prepare(params)
    with job_lock(job.job_dir, job.job_id, flow_run_id=str(flow_run.id)) as lost, factory.scope(), \
            job_lines_in_ui():  # one process per job
        if took_over(lost):
            logger.warning(took_over(lost))
        if lost and lost.get("flow_run_id") not in (None, str(flow_run.id)):
            end_lost_flow_run(lost, str(flow_run.id), logger)
        writer = make_writer(writer_for(job.concurrency, job.mode, params.max_trials, params.time_budget))
        try:
            return _run_job(params, job, logger, began, writer)
        finally:
            writer.shutdown()  # drive() shut it down already, unless the job failed before


def _run_job(params: TuneParams, job: Job, logger, began: float, writer: Writer) -> dict[str, Any]:
    """The job from its start line to its summary: parent run, state (a resume's), the loop, the champion, reports."""
    plan = schedule.plan_summary(job.min_resource, job.max_resource, job.eta)
    max_trials = params.max_trials or plan["configs"]
    try:
        job = _start(params, job, plan, max_trials, logger)
    except _NoParentRun as no:  # MLflow did not answer for --service-wait: one line (the CLI's exit 75), no traceback
        return Cancelled(message=f"job {job.job_id} stopped: MLflow at {job.tracking_uri} did not answer within "
                                 f"{params.service_wait:g} s (--service-wait): {first_line(no.__cause__)}; nothing ran, "
                                 "run the same command again")
    clock = lambda: spent + time.perf_counter() - began  # noqa: E731  (ASHA's time budget, across resumes)
    found = load_state(job, lambda state: make_scheduler(job, max_trials, params.time_budget, clock, state))
    saved, scheduler = found if found else (None, make_scheduler(job, max_trials, params.time_budget, clock))
    rows, spent = (saved["rows"], float(saved["elapsed"])) if saved else ([], 0.0)
    lost = float(saved.get("lost", 0.0)) if saved else 0.0
    runs: dict[str, str] = dict(saved.get("runs") or {}) if saved else {}  # trial id -> its child run
    if saved:
        tracking.set_status(job.tracking_uri, job.parent_run_id, "RUNNING")  # it ended KILLED if the job was stopped
        _adopt_runs(job, runs)
        close_decided(job, scheduler, runs)
        logger.info("job %s resumed: %d trial-rungs kept", job.job_id, len(rows))
    progress = report.ProgressBar(report.report_start(plan["trial_rungs"]), plan["trial_rungs"])
    if not job.trial_pool:
        factory.get(job.settings)  # start the cluster and load the data once, before the first trial
    try:
        run = drive(job, scheduler, rows, spent, baseline=params.baseline and bool(job.default_config), lost=lost,
                    runs=runs, progress=progress, saved=saved, writer=writer, criteria=_criteria(job, params),
                    clock=clock, importance=params.importance)
    except JobStopped as stop:
        return _stopped(job, scheduler, runs, stop, logger)
    records = scheduler.records()
    if run.stopped_by:
        _pause_open_runs(job, records, runs, run.stopped_by)
    end_orphan_runs(job, records, runs, logger)
    points = front.points(records, job.directions) if job.objectives else []  # several objectives: the front, once
    summary, best = _summarise(job, records, run.rows, run.default_score, run.elapsed, run.lost, runs, points)
    version = _champion(params, job, best, logger)
    mattered = _importance(job, records, params.importance, logger)
    progress.finish()
    report.report_results(
        [RungResult(**r) for r in run.rows], {t.trial_id: t.config for t in records}, summary, job.metric_key,
        job.direction, job.tracking_uri, job.parent_run_id, title=f"Hyperband job {job.job_id}",
        extra={"MLflow parent run": job.parent_run_id, "champion version": version}, runs=runs,
    )
    if job.objectives:
        log_front(job, records, run.rows, runs, best["trial_id"] if best else None, points)
    text = _summary_text(job, summary, run, len(records), max_trials, params.time_budget, mattered, points, best)
    finish_job_run(job, _job_metrics(job, summary, run.elapsed), _best_config(job, best), summary.to_json(), text)
    logger.info("summary\n%s", text, extra={"hyperband_terminal": False})  # the CLI prints it once
    return {
        "job_id": job.job_id,
        "job_dir": job.job_dir,
        "storage": job.store().root,
        "parent_run_id": job.parent_run_id,
        "direction": job.direction,
        "summary": summary.to_json(),
        "table": text,
        "best": best,
        "champion_version": version,
        "stopped_by": run.stopped_by,
        "warm_start": {k: job.warm[k] for k in ("parents", "kind", "note")} if job.warm else None,
    }


def _summary_text(job: Job, summary: Summary, run, configs: int, max_trials: int, time_budget: float | None,
                  mattered: Importance | None, points: list[front.Point], best: dict[str, Any] | None) -> str:
    """The summary the CLI prints and the parent run keeps: the cost/gain table, then what else the job tells."""
    text = table(summary)
    if job.mode == "asha":
        text += "\n" + _asha_line(configs, max_trials, time_budget, run.elapsed)
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


def _importance(job: Job, records: list[TrialRecord], method: str, logger) -> Importance | None:
    """Which hyperparameters mattered (Optuna's evaluators, ``hyperband.importance``), published on the parent run
    and the flow run; None when switched off, or no rung has enough results (said in the log)."""
    if method == "none":
        return None
    try:
        found = importance_report.compute(job, records, method)
    except Exception as exc:  # noqa: BLE001  (the job's results stand without it)
        logger.warning("importance (%s) failed: %s: %s", method, type(exc).__name__, exc)
        return None
    if found is None:
        logger.info("importance: no rung has %d finished results yet", MIN_RESULTS)
        return None
    importance_report.publish(found, job.tracking_uri, job.parent_run_id, importance_report.results_in(records))
    return found


def _criteria(job: Job, params: TuneParams) -> Criteria:
    """When the job ends before its schedule does; ASHA applies its time budget itself (no new config; promotions go
    on), the one it is resumed with."""
    return Criteria(target_score=params.target_score, target_resource=params.target_resource, patience=params.patience,
                    max_cost=params.max_cost, time_budget=None if job.mode == "asha" else params.time_budget)


def _pause_open_runs(job: Job, records, runs: dict[str, str], reason: str) -> None:
    """A criterion ended the job: the runs of trials still waiting in a rung end (a resume goes on with them)."""
    tracking.set_tags(job.tracking_uri, job.parent_run_id, {"hyperband.stopped_by": reason})
    for t in records:
        if t.status == "running" and t.trial_id in runs:
            tracking.set_tags(job.tracking_uri, runs[t.trial_id], {"hyperband.status": "paused"})
            tracking.end_run(job.tracking_uri, runs[t.trial_id], "FINISHED")


class _NoParentRun(Exception):
    """MLflow did not answer the parent run's creation past its retries (its cause says how)."""


def _start(params: TuneParams, job: Job, plan: dict[str, Any], max_trials: int, logger) -> Job:
    """The job's start line, its trial pool's deployment, its parent run (made once) and its record."""
    logger.info("job %s (%s, %s sampler, %d slots): %s%s; dir %s", job.job_id, job.mode, job.sampler, job.concurrency,
                _plan_line(job, plan, max_trials, params.time_budget),
                f", after the priors' mode to R={job.max_resource}" if job.prior_first else "", job.job_dir)
    if job.trial_pool:  # before any run: a missing pool is one line
        from prefect_hyperband.executors.work_pool import ensure_deployment

        logger.info("trial-rungs run as flow runs of %s on the pool's workers; storage %s",
                    ensure_deployment(job.trial_pool), job.store().root)
        if not params.storage:
            logger.warning("no --storage: checkpoints stay in %s, which every worker of pool %s must see at that "
                           "path (a shared folder); give --storage s3://... otherwise", job.job_dir, job.trial_pool)
    if job.warm:
        logger.info("%s", job.warm["note"])
    if job.parent_run_id is None:
        try:
            run_id = start_job_run(job, _run_params(job, params), params.nest_under, params.service_wait)
        except Exception as exc:
            if unavailable(exc):
                raise _NoParentRun() from exc
            raise
        job = job.with_parent(run_id)
        if job.warm:  # the jobs it started from, and the data compared
            tracking.set_tags(job.tracking_uri, job.parent_run_id, {
                "hyperband.warm_start": ",".join(job.warm["parents"]), "hyperband.warm_start.kind": job.warm["kind"],
                "hyperband.warm_start.data": job.warm["data"]})
    save_job_record(job, params.model_dump(mode="json"), parents.facts(job, params))
    return job


def _champion(params: TuneParams, job: Job, best: dict[str, Any] | None, logger) -> str | None:
    """The best model registered with the ``champion`` alias (its version), or its checkpoint on the parent run."""
    if best is None:
        return None
    version = None
    best_file = job.store().fetch(best["checkpoint"])  # local, wherever it was trained
    if params.register_model and registry.get(job.settings.model).log_model is not None:
        registered = register_champion(job, best["run_id"], best_file, _champion_metrics(job, best), best["resource"],
                                       return_state=True)
        if registered.is_completed():
            version = registered.result()
        else:  # the results stand without a registered model: say so, keep the job
            logger.error("could not register the champion model: %s", registered.message)
    if version is None:  # no flavour to log it in: its files, on the parent run
        keep_best_checkpoint(job, best_file)
        logger.info("no model registered (%s); the best checkpoint is on the parent run under best_checkpoint/",
                    "registration off" if not params.register_model else "the model has no MLflow flavour")
    return version


def _job_metrics(job: Job, summary: Summary, wall: float) -> dict[str, Any]:
    """The parent run's metrics: the summary's figures."""
    return {
        f"best_{job.metric_key}": summary.best_score,
        f"default_{job.metric_key}": summary.default_score,
        "configs": summary.configs,
        "resource_used": summary.resource_used,
        "resource_without_early_stopping": summary.resource_without_early_stopping,
        "worker_seconds": summary.worker_seconds,
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


def _stopped(job: Job, scheduler, runs: dict[str, str], stop: JobStopped, logger) -> State:
    """The job stopped on request: open runs end KILLED, the flow run ends Cancelled; ``--resume`` finishes it. A job
    stopped because a server did not answer leaves its MLflow runs open (each write would wait minutes more)."""
    message = f"job {job.job_id} {stop}{_space_needed(job, scheduler, stop)}; resume with --resume {job.job_id}"
    if (stop.reason or "").startswith("a server did not answer"):
        logger.warning("%s (MLflow runs left open: --resume ends them)", message)
        return Cancelled(message=message, data={"job_id": job.job_id, "signal": stop.signum})
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
    return Cancelled(message=message, data={"job_id": job.job_id, "signal": stop.signum})


def _space_needed(job: Job, scheduler, stop: JobStopped) -> str:
    """After a full disk: what the job's folder holds per trial-rung so far (measured), the space each needs."""
    if not (stop.reason or "").startswith("no space left"):
        return ""
    done = sum(len(t.scores) for t in scheduler.records())
    size = sum(f.stat().st_blocks * 512 for f in Path(job.job_dir).rglob("*") if f.is_file())  # as allocated
    if not done:
        return ""
    return f"; the job folder holds {size / 2**20:,.2f} MiB for {done} trial-rungs (about {size / done / 2**10:,.1f} KiB each)"


def _adopt_runs(job: Job, runs: dict[str, str]) -> None:
    """Child runs created before a kill but not yet saved in the state: into ``runs``, reused, never created
    twice (a trial the state does not hold yet, sampled again after the resume, gets its run back; its params
    come with its first result, as a new trial's do)."""
    for trial_id, run_id in tracking.existing_children(job.tracking_uri, job.parent_run_id).items():
        runs.setdefault(trial_id, run_id)


def _plan_line(job: Job, plan: dict[str, Any], max_trials: int, time_budget: float | None) -> str:
    """What the job will run, as configured: Hyperband's brackets, or ASHA's limits over them."""
    if job.mode == "asha":
        budget = f" or {time_budget:g} s (time budget), whichever comes first" if time_budget else ""
        return (f"up to {max_trials:,} configs{budget}, dealt to {len(plan['brackets'])} brackets "
                f"(r={job.min_resource}, R={job.max_resource}, eta={job.eta}) and promoted asynchronously")
    return (f"{len(plan['brackets'])} brackets, {plan['configs']} configs, {plan['trial_rungs']} trial-rungs, "
            f"{plan['resource_used']} units (vs {plan['resource_without_early_stopping']} without early stopping)")


def _asha_line(configs: int, max_trials: int, time_budget: float | None, elapsed: float) -> str:
    """Under an ASHA job's summary: how far it went against its limits."""
    budget = ""
    if time_budget:
        budget = f"; time budget {time_budget:g} s, {'spent' if elapsed >= time_budget else f'{elapsed:,.1f} s used'}"
    return f"asha: {configs:,} of at most {max_trials:,} configs started{budget}"


def _summarise(job: Job, records: list[TrialRecord], rows: list[dict[str, Any]], default_score: float | None,
               wall: float, lost: float, runs: dict[str, str],
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
        [RungResult(**r) for r in rows],
        metric=job.metric_key,  # the metric's one name: MLflow's, the leaderboard's, the summary's, the plots'
        configs=len(records),
        max_resource=job.max_resource,
        reached_max_resource=sum(1 for t in records if t.status == "completed"),
        failed_trials=sum(1 for t in records if t.status == "failed"),
        best=(best["trial_id"], best["resource"], best["score"]) if best else None,
        default_score=default_score,
        wall_seconds=wall,
        concurrency=job.concurrency,
        lost_worker_seconds=lost,
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


def _run_params(job: Job, params: TuneParams) -> dict[str, Any]:
    """The parent run's params: the fields marked ``mlflow: param``, each as the job resolved it (the metric chosen,
    the slots, the store's root, the space with any priors a warm start set); a field the model does not read: ''."""
    model = registry.get(job.settings.model)
    resolved = {
        "model": job.settings.model, "workers": job.settings.workers, "metric": job.metric,
        "concurrency": job.concurrency, "data": params.data if model.reads_data else "",
        "dask_address": job.settings.dask_address or "", "trial_pool": job.trial_pool or "",
        "storage": job.store().root, "space": job.space,
        "warm_start": ",".join(job.warm["parents"]) if job.warm else "",
    }
    unread = set(registry.model_specific_fields()) - set(model.fields)
    return {name: "" if name in unread else resolved.get(name, getattr(params, name)) for name in mlflow_params()}
