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
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from prefect_hyperband.executors.loop import Outcome
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.stopping import StopToken

#: the name of a thread that runs a trial-rung (``stuck`` counts those that still do after their job)
THREAD_PREFIX = "hyperband-trial"


class RealClock:
    """Seconds of ``time.monotonic``; waits on real futures.

    A future tells the clock itself once it is done (a callback, added the first time it is waited on), so a wait
    costs the futures that finished, not a lock on every future in flight (256 slots: ``concurrent.futures.wait``
    took 1.4 s of the job's GIL, py-spy)."""

    def __init__(self) -> None:
        self._ended: queue.SimpleQueue[Future] = queue.SimpleQueue()  # filled by the futures' own callbacks
        self._watched: set[Future] = set()  # a callback added, its end not yet handed out

    def now(self) -> float:
        return time.monotonic()

    def wait(self, futures: Iterable[Future], timeout: float) -> set[Future]:
        """The futures of ``futures`` that are done, waiting up to ``timeout`` seconds for the first."""
        wanted = set(futures)
        for future in wanted - self._watched:
            self._watched.add(future)
            future.add_done_callback(self._ended.put)  # called at once when it is done already
        deadline, ended = time.monotonic() + timeout, set()
        while True:
            while not self._ended.empty():
                ended.add(self._ended.get_nowait())
            done = ended & wanted
            left = deadline - time.monotonic()
            if done or left <= 0:
                break
            try:
                ended.add(self._ended.get(timeout=left))
            except queue.Empty:
                break
        # handed out, or no longer waited for (dropped by the caller): forgotten; one passed again is watched again
        self._watched -= ended
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
    """``work(trial_rung)`` on a thread of this executor's, each call in a copy of the caller's context (the flow
    run's), or in the context ``place`` gives the trial-rung (its group's subflow run).

    Its threads are daemons that take trial-rungs one after another: a thread is started only when none is idle. A
    training given up on its timeout that never returns keeps its thread, not the process from exiting (a
    ``ThreadPoolExecutor``'s threads are joined at exit; Python cannot stop a thread). A thread started per trial-rung
    cost the loop's thread 10.5 ms mean (max 185 ms) per ``submit`` at 256 slots: ``Thread.start`` waits for the new
    thread to run, which waits for the GIL among 256 trial-rungs' task runs (2.7 s of every wave)."""

    def __init__(self, work: Callable[[TrialRung], Outcome], stop: StopToken,
                 interrupt: Callable[[], None] = lambda: None, place: Place = in_the_jobs_run) -> None:
        self.work, self.stop, self._interrupt, self.place = work, stop, interrupt, place
        self.abandoned: list[Future] = []
        self.threads: set[threading.Thread] = set()  # its threads, running a trial-rung or idle
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a trial-rung that no ``submit`` has counted on yet
        self._queue: queue.SimpleQueue[tuple[contextvars.Context, TrialRung, Future[Outcome]] | None] = queue.SimpleQueue()
        self.numbers = itertools.count()

    def submit(self, trial_rung: TrialRung) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        future.hyperband_work = _Work()  # type: ignore[attr-defined]  (on the future: nothing kept once it is dropped)
        with self._lock:
            start = self._idle == 0
            self._idle -= not start
        self._queue.put((contextvars.copy_context(), trial_rung, future))
        if start:  # no thread idle: one more, which takes this trial-rung (or another's, as an idle one would)
            thread = threading.Thread(target=self._serve, name=f"{THREAD_PREFIX}_{next(self.numbers)}", daemon=True)
            with self._lock:
                self.threads.add(thread)
            thread.start()
        return future

    def _serve(self) -> None:
        """A thread of the executor: trial-rungs one after another, until ``shutdown``."""
        here = threading.current_thread()
        try:
            while (item := self._queue.get()) is not None:
                context, trial_rung, future = item
                context.run(self._run, trial_rung, future)
                with self._lock:
                    self._idle += 1
        finally:
            with self._lock:
                self.threads.discard(here)

    def _run(self, trial_rung: TrialRung, future: Future[Outcome]) -> None:
        """On a thread of the executor, in a copy of the submitter's context (the flow run's): the work in the context
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
        """The executor's threads end once their trial-rung has (``wait``: joined); after a stop, or with a training
        given up on its timeout still running, nothing is waited for."""
        with self._lock:
            running, self._idle = list(self.threads), 0
        for _ in running:
            self._queue.put(None)
        if wait and not self.stuck():
            for thread in running:
                thread.join()

    def stuck(self) -> int:
        return sum(1 for f in self.abandoned if not f.done())


def stuck() -> int:
    """Threads of this process still running a trial-rung after their job ended (a hung user function given up
    on its timeout): the CLI exits without waiting for them."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and getattr(t, "hyperband_busy", False))
