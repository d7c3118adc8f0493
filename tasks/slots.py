"""A job's trial slots: ``concurrency`` trainings at once across all its brackets (a cap, not a per-bracket size)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_slots: dict[str, threading.BoundedSemaphore] = {}
_lock = threading.Lock()


@contextmanager
def slot(job_id: str, concurrency: int) -> Iterator[None]:
    """Hold one of the job's ``concurrency`` slots while training (process-wide: tasks run in threads)."""
    with _lock:
        semaphore = _slots.setdefault(job_id, threading.BoundedSemaphore(concurrency))
    with semaphore:
        yield
