"""A job's stop request (Ctrl-C, SIGTERM, a cancellation from the Prefect UI), one token per job.

Plain Python, shared by the driver and the trainers: the driver makes a ``StopToken`` per job and binds
it to the job's context (``bind``), which every thread of its trial-rungs copies; the signal handler
requests the stop on it. Trainers that run in the job's own threads look at it between units
(``check``, ``sleep``, ``requested``: XGBoost after each boosting round, the synthetic model while it
sleeps, a user function when it reports) and give up with ``Stopped``, saving no checkpoint for the
units they did not finish. Trainers that run in processes are stopped by killing them. Two jobs in
one process have two tokens: stopping one leaves the other running.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator


class Stopped(Exception):
    """The job is stopping: this training gave up before its resource; nothing was saved."""


class StopToken:
    """One job's stop request, and the threads whose trial-rung was given up (a timeout)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signum: int | None = None
        self._reason: str | None = None
        self._cancelled: set[int] = set()
        # told of every stop and give-up: a sleeping training waits on it once, not in a polling loop (256 slots
        # polling 5 times a second took the GIL 1,280 times a second); re-entrant, as a signal handler notifies
        self._changed = threading.Condition(threading.RLock())

    def request(self, signum: int = 0, reason: str | None = None) -> None:
        """Stop the job: on a signal (``signum``), or for a ``reason`` the job cannot go on past (its cluster
        gone); the first request names the stop."""
        if self._signum is None:
            self._signum, self._reason = signum, reason
        self._event.set()
        self._notify()

    def requested(self) -> bool:
        """The whole job is stopping."""
        return self._event.is_set()

    @property
    def signum(self) -> int:
        """The signal that asked for the stop (0: none did, or no stop)."""
        return self._signum or 0

    @property
    def reason(self) -> str | None:
        """Why the job stopped when no signal asked (None for a signal or a cancellation)."""
        return self._reason

    def cancel_thread(self, ident: int) -> None:
        """Stop the training running in thread ``ident`` at its next unit (its trial-rung timed out)."""
        self._cancelled.add(ident)
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def clear_thread(self) -> None:
        """The calling thread starts a new trial-rung: an earlier cancellation no longer applies."""
        self._cancelled.discard(threading.get_ident())

    def here(self) -> bool:
        """The job is stopping, or the calling thread's trial-rung was given up."""
        return self._event.is_set() or threading.get_ident() in self._cancelled

    def wait_here(self, seconds: float) -> bool:
        """Until the job stops or the calling thread's trial-rung is given up (True), at most ``seconds``."""
        with self._changed:
            return self._changed.wait_for(self.here, seconds)


_token: contextvars.ContextVar[StopToken | None] = contextvars.ContextVar("hyperband_stop", default=None)


@contextlib.contextmanager
def bind(token: StopToken) -> Iterator[StopToken]:
    """``token`` is the job's for the code run in this context (and in the contexts copied from it)."""
    reset = _token.set(token)
    try:
        yield token
    finally:
        _token.reset(reset)


def current() -> StopToken | None:
    return _token.get()


def requested() -> bool:
    """The job of this context is stopping, or this thread's trial-rung was given up; False outside a job."""
    token = _token.get()
    return token is not None and token.here()


def check() -> None:
    token = _token.get()
    if token is not None and token.here():
        raise Stopped("the job is stopping" if token.requested() else "the trial-rung was given up")


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early, with ``Stopped``, when a stop is requested."""
    token = _token.get()
    if token is None:
        time.sleep(seconds)
        return
    token.wait_here(max(0.0, seconds))
    check()
