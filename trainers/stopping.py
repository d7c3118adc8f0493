"""A stop requested for the whole job (Ctrl-C, SIGTERM, a cancellation from the Prefect UI).

Plain Python, shared by the driver and the trainers: the driver requests the stop from its signal
handler; trainers that run in the job's own threads look at it between units (XGBoost after each
boosting round, the synthetic model while it sleeps, a user function when it reports) and give up
with ``Stopped``, saving no checkpoint for the units they did not finish. Trainers that run in
processes are stopped by killing them (``interrupt()``).
"""

from __future__ import annotations

import threading
import time

_requested = threading.Event()
_signal: list[int] = []
_cancelled: set[int] = set()  # threads whose trial-rung was given up (a timeout): their training stops too


class Stopped(Exception):
    """The job is stopping: this training gave up before its resource; nothing was saved."""


def request(signum: int = 0) -> None:
    if not _requested.is_set():
        _signal.append(signum)
    _requested.set()


def requested() -> bool:
    """The job is stopping, or the calling thread's trial-rung was given up."""
    return _requested.is_set() or threading.get_ident() in _cancelled


def cancel_thread(ident: int) -> None:
    """Stop the training running in thread ``ident`` at its next unit (its trial-rung timed out)."""
    _cancelled.add(ident)


def clear_thread() -> None:
    """A thread starts a new trial-rung: an earlier cancellation no longer applies."""
    _cancelled.discard(threading.get_ident())


def signal_number() -> int | None:
    """The signal that asked for the stop (0 when none did), or None when no stop was requested."""
    return _signal[0] if _signal else None


def reset() -> None:
    """For a new job in the same process (tests, notebooks)."""
    _requested.clear()
    _signal.clear()
    _cancelled.clear()


def check() -> None:
    if requested():
        raise Stopped("the job is stopping" if _requested.is_set() else "the trial-rung was given up")


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early, with ``Stopped``, when a stop is requested."""
    deadline = time.monotonic() + seconds
    while not _requested.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic()))):
        check()
        if time.monotonic() >= deadline:
            return
    check()
