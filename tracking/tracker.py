"""The loop's ``Tracker`` on MLflow: every write on one writer (a process of its own), in order, off the
trial-rungs' path.

A new trial's child run is created while it trains; a trial-rung's metrics (with the trial's params on its
first) are written once it is evaluated, before its result enters the job's state, so a job killed in
between trains that trial-rung again but never leaves a recorded result without its run; the runs of
decided trials are closed after. The map trial id -> run id is this side's (saved with the job's state).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.result import Outcome
from prefect_hyperband.hyperband.first import is_baseline
from prefect_hyperband.hyperband.promotion import best_rung
from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.tracking.service_wait import client_waits
from prefect_hyperband.tracking.writer import ProcessWriter, ThreadWriter, Writer, make_writer, writer_for
from prefect_hyperband.trainers.stopping import StopToken

#: trial runs ended per call of the writer (``MlflowTracker.close``)
CLOSE_CHUNK = 100


class MlflowTracker:
    """``runs``: trial id -> child run (saved ones, and those a killed run of the job created: reused). The writes
    go through ``tracking.writer`` (a process of their own by default), in the order they are made."""

    def __init__(self, job: Job, runs: dict[str, str], records: Callable[..., list[TrialRecord]], stop: StopToken,
                 warn: Callable[[str], None], writer: Writer | None = None,
                 best: dict[str, tuple[int, float]] | None = None) -> None:
        self.job, self.runs, self.records, self.stop, self.warn = job, runs, records, stop, warn
        #: trial id -> its best (resource, value) over the rungs written (a resume's: ``scheduler.trial_bests``)
        self.best = dict(best or {})
        self.creating: dict[str, Future[str]] = {}
        self.lock = threading.Lock()  # ``runs`` grows on the writer's thread; the state's saves read it under this
        self.writer = writer or make_writer(writer_for(job.concurrency, job.mode, None, None))
        self.waiting = _Waiting(job.tracking_uri, warn)
        self.close_failed = False  # said once

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Before the first trial-rung: the writer answers (a process imports MLflow first). Results recorded late
        would leave ASHA deciding on fewer results than it has; a writer process that cannot start is replaced by
        a thread of this process, in one warning line."""
        try:
            self.writer.submit("ping").result(timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            self.warn(f"MLflow: the writer process did not start ({type(exc).__name__}: {exc}); writing from a thread")
            if isinstance(self.writer, ProcessWriter):
                self.writer.proc.kill()
            self.writer.shutdown()
            self.writer = ThreadWriter()

    def start(self, trial_rung: TrialRung) -> None:
        t = trial_rung.trial_id
        if t in self.runs or t in self.creating:  # (the loop starts none for the baseline)
            return
        self.creating[t] = self.waiting.watch(self.writer.submit("start", self.job, t, trial_rung.bracket, time.time()))

    def record(self, out: Outcome) -> Future[Outcome]:
        """The trial-rung's metrics, to the trial's run (made then if its creation failed), with the trial's best so
        far (``best``); its future ends once written, with the run known (``runs``). The baseline's has no run: its
        metric goes on the parent run at the job's end (``default_<metric>``)."""
        trial_rung = out.trial_rung
        if is_baseline(trial_rung.bracket):
            kept: Future[Outcome] = Future()
            kept.set_result(out)
            return kept
        logged, config = None, None
        if not (out.error is not None and self.stop.requested()):  # stopped, not failed: --resume trains it again
            # a trial's first rung brings its params (again, the same values, when it is trained again after a kill),
            # made from its config by the writer (off the loop's thread)
            config = trial_rung.config if trial_rung.rung == 0 else None
            logged = out if out.error is None or config is not None else None
        # the trial's best so far, its run's best_<metric>, ranked as the job's best is (a tie keeps the smaller
        # resource; NaN is no score)
        best = self.best.get(trial_rung.trial_id)
        if out.error is None and out.metric is not None:
            scores = {trial_rung.resource: out.metric, **dict([best] if best else [])}
            best = best_rung(trial_rung.trial_id, scores, self.job.direction) or best
        written = self.waiting.watch(self.writer.submit("record", self.job, trial_rung.trial_id, trial_rung.bracket,
                                                        out.started or time.time(), self.runs.get(trial_rung.trial_id),
                                                        logged, config, best))
        done: Future[Outcome] = Future()

        def settle(f: Future) -> None:
            try:
                run_id = f.result()
                with self.lock:
                    self.runs.setdefault(trial_rung.trial_id, run_id)
                if best is not None:  # written: the trial's next rung compares with it
                    self.best[trial_rung.trial_id] = best
            except Exception as exc:  # noqa: BLE001  (the loop sees the write's failure)
                done.set_exception(exc)
                return
            self.creating.pop(trial_rung.trial_id, None)
            done.set_result(out)

        written.add_done_callback(settle)
        return done

    def record_failure(self, out: Outcome) -> Outcome:
        try:
            return self.record(out).result()
        except Exception as why:  # the result stands in the state; the run gets it on a resume's close
            self.warn(f"MLflow: no run for failed trial {out.trial_rung.trial_id}: {why}")
            return out

    def close(self, trial_ids: list[str]) -> None:
        """End the runs of decided trials, ``CLOSE_CHUNK`` runs per writer call: a long close (ASHA's end ends a
        thousand runs, 14 s on a local store) answers as it goes, and is not taken for MLflow not answering."""
        records = self.records(trial_ids)

        def said(f: Future) -> None:
            exc = f.exception()
            if exc is not None and not self.close_failed:  # the results stand in the job's state; a resume closes them
                self.close_failed = True
                self.warn(f"MLflow: closing trial runs failed after retries: {type(exc).__name__}: {exc}")

        for start in range(0, len(records), CLOSE_CHUNK):
            part = records[start:start + CLOSE_CHUNK]
            runs = {t.trial_id: self.runs[t.trial_id] for t in part if t.trial_id in self.runs}
            self.waiting.watch(self.writer.submit("close", self.job, part, runs)).add_done_callback(said)

    def drain(self) -> None:
        """Every write done; runs created for trials that left no result yet are kept (``runs``) for --resume."""
        self.writer.shutdown()
        self.waiting.close()
        for trial_id, future in list(self.creating.items()):
            try:
                run_id = future.result(timeout=0)
            except Exception:  # noqa: BLE001  (never made: nothing to keep)
                continue
            with self.lock:
                self.runs.setdefault(trial_id, run_id)
        self.creating.clear()


class _Waiting:
    """One warning line when a write has waited ``WARN_AFTER`` seconds (MLflow's server answering 503, or gone:
    its client retries for about 4 minutes, silently), and one when writes go through again."""

    WARN_AFTER = 10.0
    POLL = 1.0

    def __init__(self, uri: str, warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 watching: bool = True) -> None:
        self.uri, self.warn, self.clock = uri, warn, clock
        self.pending: dict[int, float] = {}
        self.lock, self.done = threading.Lock(), threading.Event()
        self.since: float | None = None  # when the waiting that was said began
        self.answered = clock()  # the last answer: writes queued before it have waited only since then
        self.thread = threading.Thread(target=self._watch, name="mlflow-waiting", daemon=True)
        if watching:
            self.thread.start()

    def watch(self, future: Future) -> Future:
        key = id(future)
        with self.lock:
            self.pending[key] = self.clock()
        future.add_done_callback(lambda f: self._answered(key, f.exception() is None))
        return future

    def _answered(self, key: int, ok: bool) -> None:
        now = self.clock()
        with self.lock:
            self.pending.pop(key, None)
            since = self.since
            if ok:
                self.since, self.answered = None, now
        if since is not None and ok:
            self.warn(f"MLflow at {self.uri} answers again after {now - since:.0f} s")

    def check(self) -> None:
        """One look: say so if the oldest pending write has waited ``WARN_AFTER`` seconds since MLflow last
        answered (a backlog queued during an outage that has just ended is not a new outage)."""
        now = self.clock()
        with self.lock:
            oldest = min(self.pending.values(), default=None)
            waited_from = None if oldest is None else max(oldest, self.answered)
            late = self.since is None and waited_from is not None and now - waited_from >= self.WARN_AFTER
            if late:
                self.since = waited_from
        if late:
            self.warn(f"MLflow at {self.uri} has not answered for {self.WARN_AFTER:.0f} s; the job waits for it "
                      f"(its client retries a server error or a lost connection for up to {client_waits():.0f} s, "
                      "--service-wait; then the job stops and --resume goes on)")

    def _watch(self) -> None:
        while not self.done.wait(self.POLL):
            self.check()

    def close(self) -> None:
        self.done.set()
