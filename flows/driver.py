"""The job's driver: wires the loop (``executors.loop``) to the job's scheduler, an executor, the MLflow tracker,
the real clock and the job's stop token, and tells the logs, the live display and the Prefect UI what the
results decided. It holds no loop of its own and no state between jobs."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger

from prefect_hyperband.common.errors import shown
from prefect_hyperband.executors import progress as display
from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.loop import Drive, JobStopped, Loop, Outcome, stop_grace
from prefect_hyperband.executors.state import StateWriter
from prefect_hyperband.executors.threads import RealClock, ThreadExecutor
from prefect_hyperband.flows import progress_bar, runner
from prefect_hyperband.flows.groups import Groups
from prefect_hyperband.flows.worker_slots import LiveSlots, slot_count
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.hyperband.criteria import Criteria, Goal
from prefect_hyperband.hyperband.first import PRIOR_BRACKET, PRIOR_TRIAL, is_baseline
from prefect_hyperband.hyperband.journal import Journal
from prefect_hyperband.hyperband.promotion import best_key, failed, first, sort_key
from prefect_hyperband.hyperband.scheduler import Decision, Scheduler, best_of, trial_bests
from prefect_hyperband.tasks import importance_report
from prefect_hyperband.tasks.trials import promote_rung
from prefect_hyperband.tracking.records import close_trial_runs
from prefect_hyperband.tracking.tracker import MlflowTracker
from prefect_hyperband.tracking.writer import Writer
from prefect_hyperband.trainers import factory, stopping

#: seconds between progress-artifact updates: one API write per interval, not per result
PROGRESS_INTERVAL = 2.0


def drive(job: Job, scheduler: Scheduler, rows: list[dict[str, Any]], spent: float, lost: float = 0.0,
          runs: dict[str, str] | None = None, progress: progress_bar.ProgressBar | None = None,
          saved: dict[str, Any] | None = None, writer: Writer | None = None, criteria: Criteria | None = None,
          clock=lambda: 0.0, importance: str = "none") -> Drive:
    """Run ``scheduler`` to the end with ``job.concurrency`` trial-rungs in flight; state saved after every pass
    that settled results (a journal record; ``executors.state.StateWriter``). ``runs``: trial id -> child run, kept up
    to date here (saved ones, and those a killed run of the job created); ``saved``: the state it resumes;
    ``writer``: the trials' MLflow writer (``tracking.writer``), shut down here; ``criteria``: when the job ends before
    its schedule does (``hyperband.criteria``; ``clock``: the job's seconds across resumes, for a time budget);
    ``importance``: under ASHA, the method of the importances published while results arrive (``none``: none).

    Ctrl-C or SIGTERM (the job flow handles them) stops the job: no new trial-rung starts, those in flight get
    ``loop.stop_grace()`` seconds (8, or ``HYPERBAND_STOP_GRACE``), the state is saved and ``JobStopped`` raised. A
    second signal exits at once."""
    token = stopping.current()  # bound by the job flow (``flows.tune``), which handles the signals
    assert token is not None, "drive() runs inside the job flow, which binds the job's stop token"
    runs = {} if runs is None else runs
    logger = get_run_logger()
    trainers = factory.current()
    groups = Groups(job.mode, warn=logger.warning,  # the trial-rungs' subflow runs (``flows.groups``)
                    upcoming=_upcoming(scheduler))  # read here, on the loop's thread, before any trial-rung runs
    where = _where(job, trainers)
    executor = ThreadExecutor(where, token,
                              interrupt=lambda: trainers.interrupt(job.settings), place=groups.enter)
    tracker = MlflowTracker(job, runs, scheduler.records, token, logger.warning, writer,
                            trial_bests(scheduler.records(), job.directions))  # a resume's trials' best so far
    tracker.wait_ready()
    events = _Events(job, scheduler, logger, progress or progress_bar.ProgressBar(None, 0), groups,
                     _live_importance(job, importance))
    _show_start(job, rows, scheduler)
    journal, saved = Journal(), saved or {}
    state = StateWriter(job, scheduler, runs, int(saved.get("journal") or 0), len(rows), saved.get("writes"),
                        runs_lock=tracker.lock, on_full=lambda reason: token.request(reason=reason), journal=journal)
    state.start(rows, spent, lost)
    spent_ws = _WorkerSeconds(lambda: loop.rows, lambda: loop.lost)
    goal = Goal(criteria, job.direction, job.max_resource, cost=spent_ws, clock=clock, rows=rows,
                metric=job.metric_key) if criteria is not None and criteria.any() else None
    loop = Loop(scheduler, executor, tracker, RealClock(), token, events, save=state.save,
                concurrency=job.concurrency, workers=job.settings.workers, slots=_slots(job),
                trial_timeout=job.trial_timeout, rows=rows, spent=spent, lost=lost, grace=stop_grace(), journal=journal,
                goal=goal)
    try:
        result = loop.run()
        if goal is not None and goal.reason is not None:
            logger.info("stopped: %s; --resume %s with a looser criterion goes on", goal.reason, job.job_id)
            return dataclasses.replace(result, stopped_by=goal.reason)
        return result
    finally:
        events.flush()
        events.close()
        groups.close()
        display.stop()


def _slots(job: Job) -> Callable[[], int] | None:
    """The slots of a job on task workers with no ``--concurrency``: those the workers serving its code offer (each its
    ``--limit``, or one), as they come and go; None: ``job.concurrency``."""
    if not (job.task_workers and job.follow_workers):
        return None
    from prefect_hyperband.flows.task_workers import key_of

    key = key_of(job.task_storage)  # the workers reading the job's storage (``worker_slots``)
    return LiveSlots(job.concurrency, lambda: slot_count(key))


def _where(job: Job, trainers: Any) -> Callable[[Any], Outcome]:
    """Where a trial-rung runs: a flow run on the job's trial pool (``flows.work_pool``), a background task run a
    ``hyperband worker`` takes (``flows.task_workers``), or this process's thread with the job's trainer (built by
    the job flow, before)."""
    if job.trial_pool:
        from prefect_hyperband.flows.work_pool import run_remote

        return lambda trial_rung: Outcome(trial_rung, *run_remote(job, trial_rung))
    if job.task_workers:
        from prefect_hyperband.flows.task_workers import run_on_workers

        return lambda trial_rung: Outcome(trial_rung, *run_on_workers(job, trial_rung))
    return functools.partial(runner.work, job, trainer=trainers.get(job.settings))


class _WorkerSeconds:
    """Worker-seconds spent so far (``hyperband.accounting``'s: trainings x workers, evaluations, lost ones), kept up
    to date over the loop's rows as they grow: no scan of the job."""

    def __init__(self, rows, lost) -> None:
        self.rows, self.lost, self.n, self.total = rows, lost, 0, 0.0

    def __call__(self) -> float:
        rows = self.rows()
        for r in rows[self.n:]:
            self.total += r["train_seconds"] * r["workers"] + r["eval_seconds"]
        self.n = len(rows)
        return self.total + self.lost()


def close_decided(job: Job, scheduler: Scheduler, runs: dict[str, str]) -> None:
    """On resume: end again the runs of trials already decided (a kill may have come before their closing)."""
    close_trial_runs(job, [t for t in scheduler.records() if t.status != "running"], runs)


class _Events:
    """What the loop tells: a line per closed rung (ASHA: per new best), the promote task, the progress
    artifact (moved at most every ``PROGRESS_INTERVAL`` seconds) and the live display."""

    def __init__(self, job: Job, scheduler: Scheduler, logger, progress: progress_bar.ProgressBar,
                 groups: Groups | None = None, live: importance_report.Live | None = None) -> None:
        self.job, self.scheduler, self.logger, self.progress, self.live = job, scheduler, logger, progress, live
        self.groups = groups or Groups(job.mode)
        self.pending, self.last, self.results = 0, time.monotonic(), 0
        found = best_of(scheduler.records(), job.direction)  # once; then kept up to date result by result
        self.best = None if found is None else (found[0].trial_id, found[1], found[2])

    def warning(self, message: str) -> None:
        self.logger.warning(message)

    def settled(self, out: Outcome, decisions: list[Decision]) -> None:
        if is_baseline(out.trial_rung.bracket):  # not a result of the search: one line, nothing else moves
            self._baseline(out)
            return
        trial_rung, self.results = out.trial_rung, self.results + 1
        improved = self._improves(out)
        self._advance()
        _show_result(out, self.best)
        if out.error:
            self.logger.warning("trial %s failed at r=%d: %s", trial_rung.trial_id, trial_rung.resource, shown(out.error))
        elif trial_rung.trial_id == PRIOR_TRIAL:
            self.logger.info("the priors' mode at r=%d: %s %s (trial %s, trained first)", trial_rung.resource,
                             self.job.metric_key, "n/a" if out.metric is None else f"{out.metric:.4f}", PRIOR_TRIAL)
        for d in decisions:
            if d.kind == "rung_closed":
                self._rung(d, decisions)
        if self.job.mode == "asha":
            _log_asha(self.logger, self.job, out, self.results, self.best, improved)
        if self.live is not None:
            self.live.offer(self.scheduler.records)
        self.groups.settled(decisions)

    def _baseline(self, out: Outcome) -> None:
        if out.error:
            self.logger.warning("the default config failed at r=%d: %s; the summary has no baseline",
                                out.trial_rung.resource, shown(out.error))
        else:
            self.logger.info("the default config at r=%d: %s %s (the baseline, not a trial of the search)",
                             out.trial_rung.resource, self.job.metric_key,
                             "n/a" if out.metric is None else f"{out.metric:.4f}")

    def _improves(self, out: Outcome) -> bool:
        """Whether ``out`` is the best so far (``best_of``'s ranking, kept result by result: no scan of the job)."""
        if out.error is not None or out.score is None or failed(out.score):
            return False
        t, r = out.trial_rung.trial_id, out.trial_rung.resource
        if self.best is not None:
            ours = best_key(t, r, out.score, self.job.direction)
            held = best_key(self.best[0], self.best[1], self.best[2], self.job.direction)
            if ours >= held:
                return False
        self.best = (t, r, out.score)
        return True

    def _rung(self, closed: Decision, decisions: list[Decision]) -> None:
        same = [d for d in decisions if (d.bracket, d.rung) == (closed.bracket, closed.rung)]
        promoted = [d.trial_id for d in same if d.kind == "promoted"]
        stopped = [d.trial_id for d in same if d.kind in ("stopped", "completed")]
        self.groups.in_bracket(closed.bracket, functools.partial(
            promote_rung, closed.bracket, closed.rung, closed.resource, promoted, stopped))
        _log_rung(self.logger, self.job, self.scheduler, closed, len(promoted))

    def _advance(self) -> None:
        self.pending += 1
        if time.monotonic() - self.last >= PROGRESS_INTERVAL:
            self.flush()

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            if self.live.failed:
                self.logger.warning("importance while results arrived failed: %s", self.live.failed)

    def flush(self) -> None:
        if self.pending:
            self.progress.advance(self.pending)
            self.pending, self.last = 0, time.monotonic()


def _upcoming(scheduler: Scheduler) -> list[int]:
    """Hyperband's brackets not done yet, in the order they run (side by side: all started at once); none for ASHA
    or brackets run in sequence (each started when the one before ends). Called by ``drive`` before the loop starts:
    the scheduler is read and changed by the loop's thread only, never by a trial-rung's (``Groups.enter``)."""
    if getattr(scheduler, "sequential", True):
        return []
    return [s for s, state in getattr(scheduler, "states", {}).items() if not state.done]


def _live_importance(job: Job, method: str) -> importance_report.Live | None:
    """ASHA's importances while results arrive (``tasks.importance_report.Live``); Hyperband's come at its end."""
    if job.mode != "asha" or method == "none":
        return None
    return importance_report.Live(
        lambda records: importance_report.compute(job, records, method),
        lambda found, step: importance_report.publish(found, job.tracking_uri, job.parent_run_id, step, prefect=False),
        warm=importance_report.preload)  # the imports now, while the job starts, not amid its results


def _show_start(job: Job, rows: list[dict[str, Any]], scheduler: Scheduler) -> None:
    if not display.active():
        return
    limits = ""
    if job.mode == "asha":
        budget = getattr(scheduler, "time_budget", None)
        limits = f"up to {getattr(scheduler, 'max_trials', 0):,} configs" + (f" or {budget:g} s" if budget else "")
    plan = schedule.plan_summary(job.min_resource, job.max_resource, job.eta)
    planned = {b["s"]: sum(r["n_configs"] for r in b["rungs"]) for b in plan["brackets"]}
    if job.prior_first:
        planned[PRIOR_BRACKET] = 1
    done = Counter(int(r["bracket"]) for r in rows if not is_baseline(r["bracket"]))
    display.start(display.Start(job.job_id, job.mode, job.metric_key, planned, dict(done), limits))


def _show_result(out: Outcome, best: tuple[str, int, Any] | None) -> None:
    if not display.active():
        return
    display.result(display.Result(
        out.trial_rung.bracket, out.trial_rung.trial_id, out.trial_rung.resource, out.metric,
        None if best is None else first(best[2]), None if best is None else best[0]))


def _log_rung(logger, job: Job, scheduler: Scheduler, closed: Decision, promoted: int) -> None:
    records = {t.trial_id: t for t in scheduler.records() if t.bracket == closed.bracket}
    scores = {t: first(r.scores.get(closed.resource)) for t, r in records.items() if closed.resource in r.scores}
    ranked = sorted(scores, key=lambda t: sort_key(t, scores[t], job.direction))
    top = ranked[0] if ranked else None
    failed = sum(v is None for v in scores.values())
    logger.info(
        "bracket s=%d rung %d/%d: %d trial%s at r=%d, best %s %s (%s)%s; %s",
        closed.bracket, closed.rung + 1, closed.n_rungs, len(scores), "" if len(scores) == 1 else "s", closed.resource,
        job.metric_key,
        "n/a" if top is None or scores[top] is None else f"{scores[top]:.4f}", top,
        f", {failed} failed" if failed else "",
        f"promoted {promoted}" if promoted else "bracket done",
    )


def _log_asha(logger, job: Job, out: Outcome, n: int, best: tuple[str, int, Any] | None, improved: bool) -> None:
    """A line when the best so far improves (every result would be hundreds of lines); each result at DEBUG."""
    logger.log(
        20 if improved else 10,
        "asha: %s s=%d r=%d %s %s; %d results, best %s",
        out.trial_rung.trial_id, out.trial_rung.bracket, out.trial_rung.resource, job.metric_key,
        "failed" if out.metric is None else f"{out.metric:.4f}", n,
        "n/a" if best is None else f"{first(best[2]):.4f} ({best[0]} at r={best[1]})",
    )


__all__ = ["Drive", "JobStopped", "close_decided", "drive"]
