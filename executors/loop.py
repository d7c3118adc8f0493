"""The job's loop: keep the slots busy, hand each result to the scheduler, save, stop on request.

Plain Python over what is passed in: the scheduler (what runs next, what a result decided), an
``Executor`` (where trial-rungs run: threads of this process, flow runs on a work pool, ...), a
``Tracker`` (where a trial-rung is recorded before its result enters the state), a ``Clock`` and a
stop token. No Prefect and no MLflow here: ``flows.driver`` wires the real ones, the tests fakes.

One trial-rung's path: ``_fill`` takes it from ``scheduler.next_trial_rung()`` (unless the job's goal is met:
``hyperband.criteria.Goal``), writes the call in the journal (``hyperband.journal.Journal``) and submits it; once
trained, ``_trained`` hands it to the tracker; once recorded, ``_settle`` reports it to the scheduler (and the
journal, and the goal) and adds its row; the state is saved after every pass that settled a result (the driver's
``save`` appends the journal's calls as one record: ``executors.state.StateWriter``), and only then are the pass's
results and decisions told (``Events``: the log lines, the display, the rungs' promote tasks), before the next
trial-rungs are handed out.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from prefect_hyperband.common.errors import first_line, no_space, seconds_from_env, unavailable
from prefect_hyperband.executors.result import Outcome  # (re-exported: the loop's protocol speaks it)
from prefect_hyperband.hyperband.criteria import Goal
from prefect_hyperband.hyperband.first import is_baseline
from prefect_hyperband.hyperband.journal import Journal
from prefect_hyperband.hyperband.scheduler import Decision, Scheduler
from prefect_hyperband.hyperband.trial import TrialRung, ended
from prefect_hyperband.trainers.base import TrainResult

#: a trial-rung whose orchestration (not its trainer) failed is run again this many times
ORCHESTRATION_RETRIES = 2
#: seconds the trial-rungs in flight get to end after a stop is requested (then they are abandoned), unless
#: ``HYPERBAND_STOP_GRACE`` says otherwise (``stop_grace``)
STOP_GRACE = 8.0
#: seconds the loop waits for a result before it looks at the clock (timeouts, a stop) again
POLL = 0.25


def stop_grace() -> float:
    """The stop's grace for a job: ``HYPERBAND_STOP_GRACE`` seconds, else ``STOP_GRACE`` (a training whose unit takes
    longer, and that should end it rather than be trained again by ``--resume``, wants more)."""
    return seconds_from_env("HYPERBAND_STOP_GRACE", STOP_GRACE)


class Executor(Protocol):
    """Where trial-rungs run. A future's exception is the orchestration's failure, never the trainer's."""

    def submit(self, trial_rung: TrialRung) -> Future[Outcome]: ...
    def began(self, future: Future[Outcome]) -> float | None: ...  # clock time its work began; None: queued
    def give_up(self, future: Future[Outcome]) -> None: ...  # past its timeout: its training stops at its next unit
    def interrupt(self) -> None: ...  # the job stops: trainings in processes end now
    def shutdown(self, wait: bool) -> None: ...


class Tracker(Protocol):
    """Where results are recorded (MLflow), in order, before they enter the state."""

    def start(self, trial_rung: TrialRung) -> None: ...  # a new trial's run is made while it trains (else nothing)
    def record(self, out: Outcome) -> Future[Outcome]: ...
    def record_failure(self, out: Outcome) -> Outcome: ...  # at once; never raises
    def close(self, trial_ids: list[str]) -> None: ...  # the trials' fates are decided
    def drain(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
    def wait(self, futures: Iterable[Future], timeout: float) -> set[Future]: ...


class Stop(Protocol):
    def requested(self) -> bool: ...
    def request(self, signum: int = 0, reason: str | None = None) -> None: ...
    @property
    def signum(self) -> int: ...
    @property
    def reason(self) -> str | None: ...


class Events(Protocol):
    """What the loop tells whoever watches: logs, displays, the Prefect UI."""

    def settled(self, out: Outcome, decisions: list[Decision]) -> None: ...
    def warning(self, message: str) -> None: ...


class JobStopped(Exception):
    """The job stopped on request (a signal, a cancellation); its state is saved and ``--resume`` finishes it."""

    def __init__(self, signum: int, abandoned: int, reason: str | None = None) -> None:
        super().__init__(f"stopped: {reason}" if reason else f"stopped by {signal_name(signum)}")
        self.signum, self.abandoned, self.reason = signum, abandoned, reason


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "request"


class Timeouts:
    """Seconds a trial-rung may take: ``--trial-timeout`` when given; else, from the job's own measurements,
    ``max(FLOOR, FACTOR x the 90th percentile of seconds per unit x the units to reach)``, and ``FIRST`` until
    ``MEASURED`` trial-rungs have been measured."""

    FIRST, FLOOR, FACTOR, MEASURED = 3600.0, 300.0, 20.0, 3

    def __init__(self, fixed: float | None) -> None:
        self.fixed = fixed
        self.per_unit: list[float] = []

    def observe(self, trained: TrainResult) -> None:
        if trained.resource_trained > 0:
            self.per_unit.append(trained.seconds / trained.resource_trained)

    def limit(self, trial_rung: TrialRung) -> float:
        if self.fixed:
            return float(self.fixed)
        if len(self.per_unit) < self.MEASURED:
            return self.FIRST
        ordered = sorted(self.per_unit)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return max(self.FLOOR, self.FACTOR * p90 * trial_rung.resource)


@dataclass
class Drive:
    """What the loop leaves: every finished trial-rung of the search (``RungResult`` fields) and the baseline's (the
    default config's, ``hyperband.first.Firsts``; None: not trained)."""

    rows: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    elapsed: float
    #: worker-seconds of trainings that left no result: failed, stopped, timed out, run again (measured)
    lost: float = 0.0
    #: the criterion that ended the job before its schedule did (``hyperband.criteria``); None: it ran to its end
    stopped_by: str | None = None

    @classmethod
    def of(cls, rows: list[dict[str, Any]], elapsed: float, lost: float) -> Drive:
        """The loop's rows, the baseline's apart."""
        baseline = [r for r in rows if is_baseline(r["bracket"])]
        return cls([r for r in rows if not is_baseline(r["bracket"])], baseline[-1] if baseline else None, elapsed, lost)

    @property
    def default_score(self) -> float | None:
        """The default config's metric; None when it was not trained, or failed."""
        return None if self.baseline is None else self.baseline["score"]


@dataclass
class Flight:
    """A trial-rung in flight: training (``limit``: seconds it may take) or, once trained, being recorded."""

    trial_rung: TrialRung
    limit: float
    recording: bool = False


@dataclass
class Loop:
    """Run ``scheduler`` to the end with ``concurrency`` trial-rungs in flight (``workers`` each); ``save(rows,
    elapsed, lost)`` after every pass that settled a result, ``save(..., final=True)`` once at the end."""

    scheduler: Scheduler
    executor: Executor
    tracker: Tracker
    clock: Clock
    stop: Stop
    events: Events
    save: Callable[..., None]  # save(rows, elapsed, lost, final=False)
    concurrency: int
    workers: int = 1
    #: the slots now, asked at each fill where they change while the job runs (task workers coming and going:
    #: ``flows.worker_slots.LiveSlots``); None: ``concurrency``
    slots: Callable[[], int] | None = None
    trial_timeout: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    spent: float = 0.0  # seconds of earlier runs of the job (a resume)
    lost: float = 0.0
    grace: float = STOP_GRACE
    journal: Journal = field(default_factory=Journal)  # the scheduler's calls, for the state's next record
    goal: Goal | None = None  # the job's stopping criteria: no trial-rung handed out once met
    flights: dict[Future, Flight] = field(default_factory=dict, init=False)
    retry: list[TrialRung] = field(default_factory=list, init=False)
    attempts: Counter = field(default_factory=Counter, init=False)
    to_close: list[str] = field(default_factory=list, init=False)
    told: list[tuple[Outcome, list[Decision]]] = field(default_factory=list, init=False)  # settled, not yet told
    stop_began: float | None = field(default=None, init=False)
    #: no training in flight can be past its timeout before this (``_give_up_overdue``)
    overdue_from: float = field(default=float("inf"), init=False)

    def __post_init__(self) -> None:
        self.began = self.clock.now()
        self.timeouts = Timeouts(self.trial_timeout)

    def elapsed(self) -> float:
        return self.spent + self.clock.now() - self.began

    def run(self) -> Drive:
        """The loop; ``JobStopped`` when a stop was requested (the state saved first)."""
        try:
            while True:
                self._notice_stop()
                self._fill()
                if self._over():
                    break
                done = self.clock.wait(list(self.flights), POLL)
                settled = len(self.rows)
                self._give_up_overdue()
                for future in [f for f in self.flights if f in done]:  # in the order submitted
                    self._done(future)
                if len(self.rows) > settled:  # saved, then told: no line or UI shows a result the state lacks
                    self.save(self.rows, self.elapsed(), self.lost)
                self._tell()
                self._fill()  # after the rungs' promote tasks: a promoted trial's next training follows its promotion
                self._close()
            if self.stop_began is not None:
                raise JobStopped(self.stop.signum, sum(not f.recording for f in self.flights.values()),
                                 self.stop.reason)
            if self.goal is None or self.goal.reason is None:  # a met goal leaves the waiting trials for a resume
                self.to_close += ended(self.scheduler.finish())
                self.journal.finished()
            self._close()
        finally:
            self.executor.shutdown(wait=self.stop_began is None)
            self.tracker.drain()  # every run created and closed before the summary and the champion
            self.save(self.rows, self.elapsed(), self.lost, final=True)
        return Drive.of(self.rows, self.elapsed(), self.lost)

    def _notice_stop(self) -> None:
        if self.stop.requested() and self.stop_began is None:  # Ctrl-C, SIGTERM, a cancellation
            self.stop_began = self.clock.now()
            training = sum(not f.recording for f in self.flights.values())
            self.events.warning(f"stopping: {training} trial-rungs in flight are given {self.grace:.0f} s; "
                                "the job is saved for --resume")
            self.executor.interrupt()  # trainings in processes end now; threads at their next unit

    def _fill(self) -> None:
        """Trial-rungs into the free slots while no more results than slots wait for the tracker, unless the job is
        stopping."""
        limit = max(1, self.slots()) if self.slots is not None else self.concurrency
        busy, recording = self._busy(), self._recording()  # counted once: a fill of 256 slots is not 256 x 256
        while (self.stop_began is None and not self.stop.requested() and busy < limit and recording <= limit):
            trial_rung = self.retry.pop(0) if self.retry else self._next()
            if trial_rung is None:
                return
            if not is_baseline(trial_rung.bracket):  # the baseline has no run of its own
                self.tracker.start(trial_rung)
            flight = Flight(trial_rung, self.timeouts.limit(trial_rung))
            self.flights[self.executor.submit(trial_rung)] = flight
            self.overdue_from = min(self.overdue_from, self.clock.now() + flight.limit)  # it begins after now
            busy += 1

    def _next(self) -> TrialRung | None:
        if self.goal is not None and self.goal.met():
            return None
        trial_rung = self.scheduler.next_trial_rung()
        if trial_rung is not None:
            self.journal.handed(trial_rung)
        return trial_rung

    def _busy(self) -> int:
        return sum(not f.recording for f in self.flights.values())

    def _recording(self) -> int:
        """Results trained, not yet recorded. A slot takes its next trial-rung while its last result is recorded,
        but not one more while two wait: the results the scheduler (its promotions) and the goal decide on lag the
        trainings by one per slot, however far behind the tracker falls (trial-rungs of milliseconds)."""
        return sum(f.recording for f in self.flights.values())

    def _over(self) -> bool:
        if self.stop_began is not None and self.clock.now() - self.stop_began > self.grace:
            return True
        return not self.flights

    def _done(self, future: Future) -> None:
        flight = self.flights.pop(future, None)
        if flight is None:  # given up on its timeout in this same pass
            return
        if flight.recording:
            self._recorded(flight.trial_rung, future)
        else:
            self._trained(flight, future)

    def _trained(self, flight: Flight, future: Future[Outcome]) -> None:
        """A trial-rung's training ended: its record goes to the tracker; its slot takes the next trial-rung."""
        try:
            out: Outcome | None = future.result()
        except Exception as exc:
            out, failure = None, exc
        began = self.executor.began(future)
        discarded = self.stop.requested() and (out is None or out.error is not None)
        if began is not None and (discarded or out is None or out.trained is None):
            self.lost += (self.clock.now() - began) * self.workers  # cost with no training seconds on record
        if discarded:  # stopped mid-training: not the trial's failure; --resume trains it again
            return
        if out is not None and out.trained is not None:  # attempts the trainer ran again itself (a lost Dask worker)
            self.lost += float(out.trained.info.get("lost_worker_seconds", 0.0))
        if out is None:
            self._orchestration_failed(flight.trial_rung, failure)
            return
        self.flights[self.tracker.record(out)] = Flight(flight.trial_rung, flight.limit, recording=True)

    def _recorded(self, trial_rung: TrialRung, future: Future[Outcome]) -> None:
        try:
            out = future.result()
        except Exception as exc:  # the tracking store failed past its retries
            self._orchestration_failed(trial_rung, exc)
            return
        self._settle(trial_rung, out)

    def _orchestration_failed(self, trial_rung: TrialRung, exc: Exception) -> None:
        """The orchestration failed, not the trainer (the Prefect API, the tracking store past its retries): the
        trial-rung runs again, or, past its retries, the trial fails (recorded when the tracker answers). A full disk
        or a tracking store that does not answer stops the job instead: --resume trains the trial-rung again."""
        if no_space(exc) or (unavailable(exc) and not getattr(exc, "run_again", False)):
            self._service_down(exc)
            return
        key = (trial_rung.trial_id, trial_rung.resource)
        self.attempts[key] += 1
        if self.attempts[key] <= ORCHESTRATION_RETRIES:
            self.events.warning(f"trial {trial_rung.trial_id} at r={trial_rung.resource}: {type(exc).__name__}: {exc}; running it again")
            self.retry.append(trial_rung)
            return
        out = Outcome(trial_rung, None, None, f"{type(exc).__name__}: {exc}")
        self._settle(trial_rung, self.tracker.record_failure(out))

    def _service_down(self, exc: Exception) -> None:
        """A full disk, or a server that did not answer past its client's retries (MLflow's: about --service-wait):
        the job stops (exit 75), not the trial; --resume trains the trial-rung again."""
        if not self.stop.requested():
            what = "no space left on device" if no_space(exc) else "a server did not answer past its retries"
            self.stop.request(reason=f"{what} ({type(exc).__name__}: {first_line(exc)})")

    def _give_up_overdue(self) -> None:
        """Trial-rungs past their timeout: the trial fails, its training stops at its next unit."""
        if self.stop_began is not None:
            return
        now = self.clock.now()
        if now <= self.overdue_from:  # none can be overdue yet: no pass over every flight
            return
        soonest = float("inf")
        for future, flight in list(self.flights.items()):
            if flight.recording:
                continue
            began = self.executor.began(future)
            if began is None or now - began <= flight.limit or future.done():
                soonest = min(soonest, (now if began is None else began) + flight.limit)  # not begun: begins after now
                continue
            del self.flights[future]
            self.executor.give_up(future)
            self.lost += (now - began) * self.workers
            out = Outcome(flight.trial_rung, None, None, f"TimeoutError: the trial-rung took more than {flight.limit:.0f} s "
                          "(--trial-timeout); its training was stopped")
            self._settle(flight.trial_rung, self.tracker.record_failure(out))
        self.overdue_from = soonest

    def _settle(self, trial_rung: TrialRung, out: Outcome) -> None:
        """A trial-rung's outcome into the scheduler and the rows; its decisions to the watchers."""
        if out.trained is not None and out.error is None:
            self.timeouts.observe(out.trained)
        t, r = trial_rung.trial_id, trial_rung.resource
        checkpoint, row = out.checkpoint, asdict(out.row())  # the outcome read whole, then the algorithm told
        decisions = self.scheduler.report(t, r, out.score, checkpoint, out.error)
        self.journal.reported(t, r, out.score, checkpoint, out.error)
        closed = ended(decisions)
        if self.goal is not None:
            self.goal.see(t, r, out.score)
        self.rows.append(row)
        self.told.append((out, decisions))
        self.to_close += closed

    def _tell(self) -> None:
        """The watchers learn the results of the pass, once they are in the saved state."""
        told, self.told = self.told, []
        for out, decisions in told:
            self.events.settled(out, decisions)

    def _close(self) -> None:
        if self.to_close:
            self.tracker.close(self.to_close)
            self.to_close = []


__all__ = ["Clock", "Drive", "Events", "Executor", "JobStopped", "Loop", "Outcome", "Stop", "Timeouts", "Tracker"]
