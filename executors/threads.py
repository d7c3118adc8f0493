"""Where a job's trial-rungs run: the loop's ``Executor`` and ``Clock`` over threads of this process.

``local``: each trial-rung's ``train`` and ``evaluate`` tasks in a thread of the job (a trainer may start its
own processes: DDP ranks, a Dask cluster). ``work_pool``: each trial-rung as a flow run on a Prefect work
pool, watched from a thread. Both run inside a copy of the job flow's context, so task runs and flow runs
land under the job's flow run and trainers see the job's stop token. Another engine (a Dask cluster's
workers, say) is one more class with the same four methods; the loop does not change.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from prefect_hyperband.executors.loop import Outcome
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.stopping import StopToken

#: the name of a thread that runs a trial-rung (``stuck`` counts those that still do after their job)
THREAD_PREFIX = "hyperband-trial"


class RealClock:
    """Seconds of ``time.monotonic``; waits on real futures."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, futures: Iterable[Future], timeout: float) -> set[Future]:
        done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
        return done


@dataclass
class _Work:
    """A trial-rung's thread and the time its work began (None while it waits for a thread)."""

    began: float | None = None
    thread: int | None = None


#: where a trial-rung's tasks run: a context (a copy of its group's subflow run's; None: the job's own) and the call
#: that lets its place go once it ends (``flows.groups.Groups.enter``)
Place = Callable[[TrialRung], "tuple[contextvars.Context | None, Callable[[], None]]"]


def in_the_jobs_run(trial_rung: TrialRung) -> tuple[None, Callable[[], None]]:
    """The place of a trial-rung in no group: the job's own run, nothing to release."""
    return None, lambda: None


class ThreadExecutor:
    """``work(trial_rung)`` in a thread of its own, each call in a copy of the caller's context (the flow run's), or in
    the context ``place`` gives the trial-rung (its group's subflow run)."""

    def __init__(self, work: Callable[[TrialRung], Outcome], stop: StopToken,
                 interrupt: Callable[[], None] = lambda: None, place: Place = in_the_jobs_run) -> None:
        self.work, self.stop, self._interrupt, self.place = work, stop, interrupt, place
        self.abandoned: list[Future] = []
        self.threads: list[threading.Thread] = []  # those still running when the last trial-rung was submitted
        self.numbers = itertools.count()

    def submit(self, trial_rung: TrialRung) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        future.hyperband_work = _Work()  # type: ignore[attr-defined]  (on the future: nothing kept once it is dropped)
        # a thread of its own, a daemon: a training given up on its timeout that never returns does not keep the
        # process from exiting (a pool's threads are joined at exit; Python cannot stop a thread); the loop bounds how
        # many run at once, and a thread's start costs microseconds against a trial-rung's task runs
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run, trial_rung, future),
                                  name=f"{THREAD_PREFIX}_{next(self.numbers)}", daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()
        return future

    def _run(self, trial_rung: TrialRung, future: Future[Outcome]) -> None:
        """On the trial-rung's thread, in a copy of the submitter's context (the flow run's): the work in the context
        its place gives, the place let go, then the outcome (or the error) on the future."""
        if not future.set_running_or_notify_cancel():
            return
        record = future.hyperband_work  # type: ignore[attr-defined]
        record.thread, record.began = threading.get_ident(), time.monotonic()
        self.stop.clear_thread()
        here = threading.current_thread()
        here.hyperband_busy = True  # type: ignore[attr-defined]  (``stuck`` reads it)
        try:
            context, release = self.place(trial_rung)
            try:
                outcome = self.work(trial_rung) if context is None else context.run(self.work, trial_rung)
            finally:
                release()
        except BaseException as exc:  # noqa: BLE001  (the future carries it to the loop)
            here.hyperband_busy = False  # type: ignore[attr-defined]  (not busy once its result is known)
            future.set_exception(exc)
        else:
            here.hyperband_busy = False  # type: ignore[attr-defined]
            future.set_result(outcome)

    def began(self, future: Future[Outcome]) -> float | None:
        record = getattr(future, "hyperband_work", None)
        return record.began if record is not None else None

    def give_up(self, future: Future[Outcome]) -> None:
        record = getattr(future, "hyperband_work", None)
        if record is not None and record.thread is not None:
            self.stop.cancel_thread(record.thread)
        self.abandoned.append(future)

    def interrupt(self) -> None:
        self._interrupt()

    def shutdown(self, wait: bool) -> None:
        """The trial-rungs' threads ended (``wait``); after a stop, or with a training given up on its timeout still
        running, nothing is waited for."""
        if wait and not self.stuck():
            for thread in self.threads:
                thread.join()
        self.threads = []

    def stuck(self) -> int:
        return sum(1 for f in self.abandoned if not f.done())


def stuck() -> int:
    """Threads of this process still running a trial-rung after their job ended (a hung user function given up
    on its timeout): the CLI exits without waiting for them."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and getattr(t, "hyperband_busy", False))
