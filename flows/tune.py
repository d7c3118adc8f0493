"""The tuning job: Hyperband brackets side by side (or ASHA), then the champion and the accounting."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled, Failed, State
from pydantic import ValidationError

from prefect_hyperband.common.errors import first_line, one_line, unavailable
from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.schedulers import make_scheduler
from prefect_hyperband.executors.state import load_state, save_job_record
from prefect_hyperband.flows import ending, form, parents, progress_bar, run_name
from prefect_hyperband.flows.driver import JobStopped, close_decided, drive
from prefect_hyperband.flows.lock import job_lock, took_over
from prefect_hyperband.flows.lost import end_lost_flow_run
from prefect_hyperband.flows.params import TuneParams, mlflow_params
from prefect_hyperband.flows.prepare import prepare, resolve
from prefect_hyperband.flows.process import big_blocks_to_the_os, job_lines_in_ui, stop_on_signals
from prefect_hyperband.flows.say import in_run
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.hyperband.criteria import Criteria
from prefect_hyperband.hyperband.first import is_baseline
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.record import start_job_run
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking import service_wait
from prefect_hyperband.tracking.writer import Writer, make_writer, writer_for
from prefect_hyperband.trainers import factory, registry, stopping

#: job ids whose flow run began in this process while ``app.starting.started`` starts it (it retries a job only while
#: Prefect could not start it, and takes the id out again once its start returned or failed)
bodies_begun: set[str] = set()


def tune(**values: Any) -> dict[str, Any] | State:
    """Hyperband (Li et al., JMLR 2018) or ASHA (Li et al., MLSys 2020) over the job's parameters (one per
    ``TuneParams`` field), tracked in MLflow. Bad input (a field, fields that disagree, a space or data that does not
    load) ends the flow run Failed with one line, the same in its log and its state's message."""
    logger = get_run_logger()
    began = time.perf_counter()
    try:
        params, legacy = form.from_flow(values)
        if params.job_id:
            bodies_begun.add(params.job_id)
        if legacy:
            logger.warning(form.LEGACY_WARNING)
        params = resolve(params)  # a resume takes the saved parameters; a conflicting one is refused
        job = prepare(params)
    except ValueError as exc:  # a field, fields that disagree (ValidationError), a space or data (InputError...)
        line = f"bad parameters: {one_line(exc) if isinstance(exc, ValidationError) else exc}"
        logger.error(line)
        return Failed(message=line, data=exc)  # a Python caller gets the error itself (``state.result()`` raises it)
    run_name.describe(job, params)  # a name given is kept; otherwise what the run is, and its job id
    big_blocks_to_the_os()  # the trial-rungs' threads give back what they score with
    token = stopping.current() or stopping.StopToken()  # the caller's (``prefect_hyperband.tune(stop=...)``), or new
    # one process per job; the bound before the writer's process starts: it inherits it. Ctrl-C stops the job from
    # here on (its start takes seconds: the MLflow writer, the parent run, the data), not only once trials run: the
    # handler is in place before the lock exists, and the job's trainers are closed before the lock goes
    trainers = factory.Trainers()
    with service_wait.bound_client_waits(params.service_wait), stopping.bind(token), \
            stop_on_signals(token, kill=trainers.close_all), \
            job_lock(job.job_dir, job.job_id, flow_run_id=str(flow_run.id)) as lost, factory.scope(trainers), \
            job_lines_in_ui():
        if took_over(lost):
            logger.warning(took_over(lost))
        if lost and lost.get("flow_run_id") not in (None, str(flow_run.id)):
            end_lost_flow_run(lost, str(flow_run.id), logger)
        writer = make_writer(writer_for(job.concurrency, job.mode, params.max_trials, params.time_budget))
        try:
            return _run_job(params, job, logger, began, writer)
        finally:
            writer.shutdown()  # drive() shut it down already, unless the job failed before


tune.__signature__ = form.signature()  # type: ignore[attr-defined]  (Prefect's schema and call binding read it)
tune = flow(name="hyperband-tune", validate_parameters=False)(tune)  # TuneParams validates: one line, no traceback


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
    found = load_state(job, lambda state: make_scheduler(job, max_trials, params.time_budget, clock, state), in_run)
    saved, scheduler = found if found else (None, make_scheduler(job, max_trials, params.time_budget, clock,
                                                                 warm=parents.sampler_for))
    rows, spent = (saved["rows"], float(saved["elapsed"])) if saved else ([], 0.0)
    lost = float(saved.get("lost", 0.0)) if saved else 0.0
    runs: dict[str, str] = dict(saved.get("runs") or {}) if saved else {}  # trial id -> its child run
    if saved:
        tracking.set_status(job.tracking_uri, job.parent_run_id, "RUNNING")  # it ended KILLED if the job was stopped
        _adopt_runs(job, runs)
        close_decided(job, scheduler, runs)
        logger.info("job %s resumed: %d trial-rungs kept", job.job_id, sum(not is_baseline(r["bracket"]) for r in rows))
    progress = progress_bar.ProgressBar(report.report_start(plan["trial_rungs"]), plan["trial_rungs"])
    if not job.trial_pool and not job.task_workers:
        factory.get(job.settings)  # start the cluster and load the data once, before the first trial
    try:
        run = drive(job, scheduler, rows, spent, lost=lost, runs=runs, progress=progress, saved=saved, writer=writer,
                    criteria=_criteria(job, params), clock=clock, importance=params.importance)
    except JobStopped as stop:
        return ending.stopped(job, scheduler, runs, stop, logger)
    return ending.finish(params, job, scheduler.records(), run, runs, max_trials, progress, logger)


def _criteria(job: Job, params: TuneParams) -> Criteria:
    """When the job ends before its schedule does; ASHA applies its time budget itself (no new config; promotions go
    on), the one it is resumed with."""
    return Criteria(target_score=params.target_score, target_resource=params.target_resource, patience=params.patience,
                    max_cost=params.max_cost, time_budget=None if job.mode == "asha" else params.time_budget)


class _NoParentRun(Exception):
    """MLflow did not answer the parent run's creation past its retries (its cause says how)."""


def _start(params: TuneParams, job: Job, plan: dict[str, Any], max_trials: int, logger) -> Job:
    """The job's start line, its trial pool's deployment, its parent run (made once) and its record."""
    logger.info("job %s (%s, %s sampler, %d slots): %s%s; dir %s", job.job_id, job.mode, job.sampler, job.concurrency,
                _plan_line(job, plan, max_trials, params.time_budget),
                f", after the priors' mode to R={job.max_resource}" if job.prior_first else "", job.job_dir)
    if job.trial_pool:  # before any run: a missing pool is one line
        from prefect_hyperband.flows.work_pool import ensure_deployment

        logger.info("trial-rungs run as flow runs of %s on the pool's workers; storage %s",
                    ensure_deployment(job.trial_pool), job.store().root)
        if not params.storage:
            logger.warning("no --storage: checkpoints stay in %s, which every worker of pool %s must see at that "
                           "path (a shared folder); give --storage s3://... otherwise", job.job_dir, job.trial_pool)
    if job.task_workers:
        from prefect_hyperband.flows.task_workers import TASK_NAME, trial_rung

        logger.info("trial-rungs run as %s task runs (task key %s) on hyperband workers; storage %s", TASK_NAME,
                    trial_rung.task_key, job.store().root)
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
