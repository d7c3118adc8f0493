"""The one driver loop, for synchronous brackets and ASHA alike.

Submit while slots are free, report each result as it arrives, close the rungs that are complete
(a ``promote`` task), save the state, close the MLflow runs of trials whose fate is decided.
Trial-rungs run in a bounded pool of ``concurrency`` threads inside the job flow's context,
so their ``train`` and ``evaluate`` task runs belong to the job's flow run, called with values
(no futures for Prefect to resolve). Every MLflow write goes through one writer thread, in order:
a new trial's child run is created while it trains, a trial-rung's metrics are written once it is
evaluated (its thread takes the next trial-rung meanwhile), and only then does its result enter
the state; the runs of decided trials are closed after it (a resume closes them again). So no trial
thread waits on the tracking store.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from prefect import get_run_logger
from prefect.utilities.annotations import quote

from prefect_hyperband.flows import progress as display
from prefect_hyperband.flows import runner
from prefect_hyperband.flows.state import save_state
from prefect_hyperband.hyperband import schedule
from prefect_hyperband.hyperband.promotion import sort_key
from prefect_hyperband.hyperband.scheduler import Promotion, Scheduler, TrialJob, best_of
from prefect_hyperband.tasks import report
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.record import close_trial_runs, start_trial_run
from prefect_hyperband.tasks.trials import promote_rung, train_default
from prefect_hyperband.trainers import factory, stopping

#: a trial-rung whose orchestration (not its trainer) failed is run again this many times
ORCHESTRATION_RETRIES = 2
#: seconds the trial-rungs in flight get to end after a stop is requested (then they are abandoned)
STOP_GRACE = 8.0
#: threads beyond ``concurrency``, for trial-rungs given up on their timeout while their training stops
SPARE_THREADS = 4
#: seconds between progress-artifact updates: one API write per interval, not per result
PROGRESS_INTERVAL = 2.0
_BASELINE = "default"


class JobStopped(Exception):
    """The job stopped on request (a signal, a cancellation); its state is saved and ``--resume`` finishes it."""

    def __init__(self, signum: int, abandoned: int) -> None:
        super().__init__(f"stopped by {_signal_name(signum)}")
        self.signum, self.abandoned = signum, abandoned


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "request"


def _recorded(job: Job, todo: TrialJob, out: runner.Outcome, logger, creating: Future[str] | None) -> runner.Outcome:
    """A failed trial gets its child run too, with the error, when MLflow answers."""
    try:
        return runner.record(job, todo, out.run_id, time.time(), out, creating)
    except Exception as why:
        logger.warning("MLflow: no run for failed trial %s: %s", todo.trial_id, why)
        return out


def _settle(job: Job, scheduler: Scheduler, rows: list[dict[str, Any]], progress: "_Progress", logger,
            todo: TrialJob, out: runner.Outcome) -> list[str]:
    """A trial-rung's outcome into the scheduler, the rows, the displays; close the rungs it completes.
    Returns the trials whose fate is now decided."""
    if out.run_id is not None:
        scheduler.set_run_id(todo.trial_id, out.run_id)
    ended = scheduler.report(todo.trial_id, todo.resource, out.score, out.checkpoint, out.error)
    rows.append(asdict(out.row()))
    progress.advance()
    _show_result(job, scheduler, out)
    if out.error:
        logger.warning("trial %s failed at r=%d: %s", todo.trial_id, todo.resource, out.error)
    for s, rung in scheduler.closable():
        promotion = promote_rung(quote(scheduler), s, rung)  # quoted: Prefect would walk the whole scheduler
        ended += promotion.ended
        _log_rung(logger, job, scheduler, promotion)
    if job.mode == "asha":
        _log_asha(logger, job, scheduler, out, len(rows))
    return ended


def _overdue(running: dict[Future, Any], clocks: dict[Future, dict[str, Any]]) -> list[Future]:
    now = time.monotonic()
    return [f for f in running if f in clocks and "began" in clocks[f] and not f.done()
            and now - clocks[f]["began"] > clocks[f]["limit"]]


class _Timeouts:
    """Seconds a trial-rung may take: ``--trial-timeout`` when given; else, from the job's own measurements,
    ``max(FLOOR, FACTOR x the 90th percentile of seconds per unit x the units to reach)``, and ``FIRST`` until
    ``MEASURED`` trial-rungs have been measured."""

    FIRST, FLOOR, FACTOR, MEASURED = 3600.0, 300.0, 20.0, 3

    def __init__(self, fixed: float | None) -> None:
        self.fixed = fixed
        self.per_unit: list[float] = []

    def observe(self, trained: Any) -> None:
        if trained.resource_trained > 0:
            self.per_unit.append(trained.seconds / trained.resource_trained)

    def limit(self, todo: TrialJob) -> float:
        if self.fixed:
            return float(self.fixed)
        if len(self.per_unit) < self.MEASURED:
            return self.FIRST
        ordered = sorted(self.per_unit)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return max(self.FLOOR, self.FACTOR * p90 * todo.resource)


_ABANDONED: list[Future] = []


def stuck() -> int:
    """Trial-rungs of this process given up on their timeout whose training still runs (a hung user
    function that never reports): the CLI exits without waiting for them."""
    return sum(1 for f in _ABANDONED if not f.done())


def _outcome(future: Future) -> runner.Outcome | None:
    """A finished trial-rung's outcome; None when its orchestration raised."""
    try:
        return future.result()
    except Exception:
        return None


@dataclass
class Drive:
    """What the loop leaves: every finished trial-rung (``TrialRung`` fields) and the baseline's score."""

    rows: list[dict[str, Any]]
    default_score: float | None
    elapsed: float
    #: worker-seconds of trainings that left no result: failed, stopped, timed out, run again (measured)
    lost: float = 0.0


def drive(job: Job, scheduler: Scheduler, rows: list[dict[str, Any]], spent: float, baseline: bool,
          lost: float = 0.0, runs: dict[str, str] | None = None) -> Drive:
    """Run ``scheduler`` to the end with ``job.concurrency`` trial-rungs in flight; state saved after every result.
    ``runs``: trial id -> the child run a killed run of the job created for a trial its state does not hold yet.

    Ctrl-C or SIGTERM (in the main thread: the CLI, a deployment's flow-run process) stops the job: no new
    trial-rung starts, those in flight get ``STOP_GRACE`` seconds, the state is saved and ``JobStopped``
    raised. A second signal exits at once."""
    stopping.reset()
    with _stop_on_signals():
        return _drive(job, scheduler, rows, spent, baseline, lost, runs)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if stopping.requested():
            _exit_now(signum)
        stopping.request(signum)
        print(f"hyperband: {_signal_name(signum)}: stopping within ~10 s, the job is saved for --resume "
              "(again to exit at once)", file=sys.stderr, flush=True)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _exit_now(signum: int) -> None:
    """A second signal: kill what this job started (trainer processes, the temporary Prefect server) and exit."""
    factory.interrupt_all()
    stop_temporary_servers(kill=True)
    os._exit(128 + signum)


def stop_temporary_servers(kill: bool = False) -> None:
    """Prefect's temporary servers started by this process: killed at once, or stopped (terminate, then kill)."""
    try:
        from prefect.server.api.server import SubprocessASGIServer

        for server in list(SubprocessASGIServer._instances.values()):
            if kill and server.server_process is not None:
                server.server_process.kill()
            elif not kill:
                server.stop()
    except Exception:  # leaving the process anyway: what could not be stopped dies with its parent
        pass


def _drive(job: Job, scheduler: Scheduler, rows: list[dict[str, Any]], spent: float, baseline: bool,
           lost: float, runs: dict[str, str] | None) -> Drive:
    logger = get_run_logger()
    workers = job.settings.workers * job.settings.nnodes
    began = time.perf_counter()
    attempts: Counter[tuple[str, int]] = Counter()
    retry: list[TrialJob] = []
    running: dict[Future, TrialJob | str] = {}
    default_score: float | None = None
    progress = _Progress(job.job_id)

    def elapsed() -> float:
        return spent + time.perf_counter() - began

    # spare threads: a trial-rung given up on its timeout may hold its thread until its training notices
    pool = ThreadPoolExecutor(max_workers=job.concurrency + SPARE_THREADS, thread_name_prefix="trial")
    tracker = _Tracker(job, scheduler, logger)
    limits = _Timeouts(job.trial_timeout)
    clocks: dict[Future, dict[str, Any]] = {}
    creating: dict[str, Future[str]] = {}  # trial id -> its child run, being created on the MLflow writer
    recording: dict[Future, TrialJob] = {}  # trial-rungs trained, their MLflow writes on the writer

    def submit(fn, *args, **kwargs) -> Future:
        ctx = contextvars.copy_context()  # the flow run's context: task runs land under it
        return pool.submit(ctx.run, functools.partial(fn, *args, **kwargs))

    def submit_trial(todo: TrialJob) -> Future:
        clock: dict[str, Any] = {"limit": limits.limit(todo)}
        run_id = scheduler.run_id(todo.trial_id)
        if run_id is None and todo.trial_id not in creating:  # a new trial: its run is created while it trains
            creating[todo.trial_id] = tracker.create(todo, (runs or {}).get(todo.trial_id))

        def call() -> runner.Outcome:
            clock.update(thread=threading.get_ident(), began=time.monotonic())
            stopping.clear_thread()
            return runner.run_trial_rung(job, todo, run_id)

        future = submit(call)
        clocks[future] = clock
        return future

    _show_start(job, rows)
    stop_began: float | None = None

    def orchestration_failed(todo: TrialJob, exc: Exception) -> runner.Outcome | None:
        """The orchestration failed, not the trainer (the Prefect API, the tracking store past its retries):
        the trial-rung runs again (None), or, past its retries, the trial fails (recorded when MLflow answers)."""
        key = (todo.trial_id, todo.resource)
        attempts[key] += 1
        if attempts[key] <= ORCHESTRATION_RETRIES:
            logger.warning("trial %s at r=%d: %s: %s; running it again", todo.trial_id, todo.resource, type(exc).__name__, exc)
            retry.append(todo)
            return None
        out = runner.Outcome(todo, scheduler.run_id(todo.trial_id), None, None, f"{type(exc).__name__}: {exc}")
        return _recorded(job, todo, out, logger, creating.get(todo.trial_id))

    def settle(todo: TrialJob, out: runner.Outcome) -> list[str]:
        if out.trained is not None and out.error is None:
            limits.observe(out.trained)
        return _settle(job, scheduler, rows, progress, logger, todo, out)

    def fill() -> None:
        """Trial-rungs into the free slots, unless the job is stopping."""
        while stop_began is None and not stopping.requested() and len(running) < job.concurrency:
            todo = retry.pop(0) if retry else scheduler.next_job()
            if todo is None:
                return
            running[submit_trial(todo)] = todo

    try:
        if baseline:
            running[submit(train_default, job, return_state=True)] = _BASELINE
        while True:
            if stopping.requested() and stop_began is None:  # Ctrl-C, SIGTERM, a cancellation
                stop_began = time.monotonic()
                logger.warning("stopping: %d trial-rungs in flight are given %.0f s; the job is saved for --resume",
                               len(running), STOP_GRACE)
                factory.interrupt(job.settings)  # trainings in processes end now; threads at their next unit
            fill()
            if (not running and not recording) or (stop_began is not None and time.monotonic() - stop_began > STOP_GRACE):
                break
            done, _ = wait([*running, *recording], timeout=0.25, return_when=FIRST_COMPLETED)
            ended: list[str] = []
            settled = len(rows)
            given_up = [] if stop_began is not None else _overdue(running, clocks)
            for future in given_up:  # past its timeout: the trial fails, its training stops at its next unit
                todo = running.pop(future)
                assert isinstance(todo, TrialJob)
                clock = clocks.pop(future)
                stopping.cancel_thread(clock["thread"])
                _ABANDONED.append(future)
                lost += (time.monotonic() - clock["began"]) * workers
                out = runner.Outcome(todo, scheduler.run_id(todo.trial_id), None, None,
                                     f"TimeoutError: the trial-rung took more than {clock['limit']:.0f} s "
                                     f"(--trial-timeout); its training was stopped")
                ended += settle(todo, _recorded(job, todo, out, logger, creating.get(todo.trial_id)))
            for future in done:
                if future in recording:  # its MLflow writes are done: the result enters the state
                    todo = recording.pop(future)
                    try:
                        out = future.result()
                    except Exception as exc:  # the tracking store failed past its retries
                        failed = orchestration_failed(todo, exc)
                        if failed is None:
                            continue
                        out = failed
                    ended += settle(todo, out)
                    continue
                todo = running.pop(future)
                clock = clocks.pop(future, {})
                if todo == _BASELINE:
                    default_score = None if stop_began is not None else _baseline(future, logger)
                    continue
                assert isinstance(todo, TrialJob)
                got = _outcome(future)
                discarded = stopping.requested() and (got is None or got.error is not None)
                if "began" in clock and (discarded or got is None or got.trained is None):
                    lost += (time.monotonic() - clock["began"]) * workers  # cost with no training seconds on record
                if discarded:  # stopped mid-training: not the trial's failure; --resume trains it again
                    if got is not None and got.run_id is not None:  # its run ends KILLED now, a resume reuses it
                        scheduler.set_run_id(todo.trial_id, got.run_id)
                    continue
                try:
                    out = future.result()
                except Exception as exc:
                    failed = orchestration_failed(todo, exc)
                    if failed is not None:
                        ended += settle(todo, failed)
                    continue
                # its MLflow writes go to the writer thread; the trial's slot takes the next trial-rung now
                recording[tracker.record(todo, out, creating.get(todo.trial_id))] = todo
            fill()  # the next trial-rungs train while the state is saved and runs are closed
            if len(rows) > settled:  # a result entered the state (not just a trial-rung handed to the writer)
                save_state(job, scheduler, rows, elapsed(), lost)
            tracker.close(ended)
        if stop_began is not None:
            raise JobStopped(stopping.signal_number() or 0, len(running))
        tracker.close(scheduler.finish())
    finally:
        # after a stop, a training still running past the grace is left to end at its next unit
        pool.shutdown(wait=stop_began is None and not stuck(), cancel_futures=True)
        tracker.drain()  # every run created and closed before the summary and the champion
        for trial_id, future in creating.items():  # runs of trials stopped before their first result: kept for --resume
            if scheduler.run_id(trial_id) is None and (run_id := runner.created_run(future)) is not None:
                scheduler.set_run_id(trial_id, run_id)
        save_state(job, scheduler, rows, elapsed(), lost)
        progress.flush()
        display.stop()
    return Drive(rows, default_score, elapsed(), lost)


class _Tracker:
    """MLflow writes off the trial-rungs' path, in order, on one writer thread: creating the child runs of
    new trials while they train, each trial-rung's metrics, closing the runs of decided trials."""

    def __init__(self, job: Job, scheduler: Scheduler, logger) -> None:
        self.job, self.scheduler, self.logger = job, scheduler, logger
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")

    def record(self, todo: TrialJob, out: runner.Outcome, creating: Future[str] | None) -> Future[runner.Outcome]:
        """A trial-rung's MLflow writes (a new trial's first result with its params, to the run ``creating``
        gives: created earlier on this same thread), in order; the outcome with its run id."""
        return self.writer.submit(runner.record, self.job, todo, out.run_id, out.started or time.time(), out, creating)

    def create(self, todo: TrialJob, existing: str | None = None) -> Future[str]:
        """The trial's child run, started now (its training starts now; retried), or ``existing``: the run a
        killed run of the job created for it. Its params come with its first result, in the same write."""
        if existing is not None:
            done: Future[str] = Future()
            done.set_result(existing)
            return done
        job, started = self.job, time.time()
        return self.writer.submit(start_trial_run, job, todo.trial_id, todo.bracket, started)

    def close(self, trial_ids: list[str]) -> None:
        if not trial_ids:
            return
        by_id = {t.trial_id: t for t in self.scheduler.records()}
        records = [by_id[t] for t in trial_ids]

        def write() -> None:
            try:
                close_trial_runs(self.job, records)
            except Exception as exc:  # the results stand in the job's state; a resume closes them again
                self.logger.warning("MLflow: closing %d trial runs failed after retries: %s: %s",
                                    len(records), type(exc).__name__, exc)

        self.writer.submit(write)

    def drain(self) -> None:
        self.writer.shutdown(wait=True)


def close_decided(job: Job, scheduler: Scheduler) -> None:
    """On resume: end again the runs of trials already decided (a kill may have come before their closing)."""
    close_trial_runs(job, [t for t in scheduler.records() if t.status != "running"])


def _baseline(future: Future, logger) -> float | None:
    try:
        value = future.result().result(raise_on_failure=False)
    except Exception as exc:  # the orchestration failed: the job goes on without its baseline
        value = exc
    if isinstance(value, BaseException):
        logger.warning("default config failed: %s", value)
        return None
    return float(value)


class _Progress:
    """The progress artifact, moved at most every ``PROGRESS_INTERVAL`` seconds."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self.pending, self.last = job_id, 0, time.monotonic()

    def advance(self) -> None:
        self.pending += 1
        if time.monotonic() - self.last >= PROGRESS_INTERVAL:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            report.advance_progress(self.job_id, self.pending)
            self.pending, self.last = 0, time.monotonic()


def _show_start(job: Job, rows: list[dict[str, Any]]) -> None:
    if not display.active():
        return
    plan = schedule.plan_summary(job.min_resource, job.max_resource, job.eta)
    planned = {b["s"]: sum(r["n_configs"] for r in b["rungs"]) for b in plan["brackets"]}
    done = Counter(int(r["bracket"]) for r in rows)
    display.start(display.Start(job.job_id, job.mode, job.metric_key, planned, dict(done)))


def _show_result(job: Job, scheduler: Scheduler, out: runner.Outcome) -> None:
    if not display.active():
        return
    best = best_of(scheduler.records(), job.direction)  # type: ignore[arg-type]
    display.result(display.Result(
        out.job.bracket, out.job.trial_id, out.job.resource, out.score,
        None if best is None else best[2], None if best is None else best[0].trial_id))


def _log_rung(logger, job: Job, scheduler: Scheduler, p: Promotion) -> None:
    records = {t.trial_id: t for t in scheduler.records() if t.bracket == p.bracket}
    scores = {t: r.scores.get(p.resource) for t, r in records.items() if p.resource in r.scores}
    ranked = sorted(scores, key=lambda t: sort_key(t, scores[t], job.direction))  # type: ignore[arg-type]
    top = ranked[0] if ranked else None
    failed = sum(v is None for v in scores.values())
    logger.info(
        "bracket s=%d rung %d/%d: %d trials at r=%d, best %s %s (%s)%s; %s",
        p.bracket, p.rung + 1, p.n_rungs, len(scores), p.resource, job.metric_key,
        "n/a" if top is None or scores[top] is None else f"{scores[top]:.4f}", top,
        f", {failed} failed" if failed else "",
        f"promoted {len(p.promoted)}" if p.promoted else "bracket done",
    )


def _log_asha(logger, job: Job, scheduler: Scheduler, out: runner.Outcome, n: int) -> None:
    """A line when the best so far improves (every result would be hundreds of lines); each result at DEBUG."""
    best = best_of(scheduler.records(), job.direction)  # type: ignore[arg-type]
    improved = best is not None and best[0].trial_id == out.job.trial_id and best[1] == out.job.resource
    logger.log(
        20 if improved else 10,
        "asha: %s s=%d r=%d %s %s; %d results, best %s",
        out.job.trial_id, out.job.bracket, out.job.resource, job.metric_key,
        "failed" if out.score is None else f"{out.score:.4f}", n,
        "n/a" if best is None else f"{best[2]:.4f} ({best[0].trial_id} at r={best[1]})",
    )


__all__ = ["Drive", "JobStopped", "close_decided", "drive"]
