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


class Stopped(Exception):
    """The job is stopping: this training gave up before its resource; nothing was saved."""


def request(signum: int = 0) -> None:
    if not _requested.is_set():
        _signal.append(signum)
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def signal_number() -> int | None:
    """The signal that asked for the stop (0 when none did), or None when no stop was requested."""
    return _signal[0] if _signal else None


def reset() -> None:
    """For a new job in the same process (tests, notebooks)."""
    _requested.clear()
    _signal.clear()


def check() -> None:
    if _requested.is_set():
        raise Stopped("the job is stopping")


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early, with ``Stopped``, when a stop is requested."""
    deadline = time.monotonic() + seconds
    while not _requested.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return
    raise Stopped("the job is stopping")
