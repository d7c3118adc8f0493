"""The terminal of a ``hyperband tune`` job while it runs: only what the job means to say reaches it.

Every write to the process's stdout and stderr (file descriptors 1 and 2) goes to the job's ``job.log``: what any
library in the process prints (XGBoost's collective: "Task [xgboost.dask-0]:... got rank 0", through Python's
``print`` or from native code) and what every process the job starts writes (its local Dask cluster's nannies and
workers, which inherit both). The job's own output reaches the terminal through copies of the two descriptors made
before: its summary or its one JSON document (``out``); its own lines, the live display, Prefect's console lines,
warnings and tracebacks (``err``, which ``sys.stderr`` becomes, and the console handlers' stream). Where stdout or
stderr is not a descriptor of its own (a test's capture), it is left as it is.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


@contextmanager
def job_terminal(log_path: str) -> Iterator[TextIO]:
    """Descriptors 1 and 2 on ``log_path`` (appended) for the block; yields the job's stdout (the terminal's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved: dict[int, int] = {}
    try:
        for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
            if _on(stream, fd):
                saved[fd] = os.dup(fd)
                os.dup2(target, fd)
    finally:
        os.close(target)
    out = _writer(saved[1], sys.stdout) if 1 in saved else sys.stdout
    before = sys.stderr
    err = _writer(saved[2], before) if 2 in saved else before
    moved = _repoint(before, err) if err is not before else []
    sys.stderr = err
    try:
        yield out
    finally:
        for stream in (out, err, sys.stdout):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, copy in saved.items():
            os.dup2(copy, fd)
        sys.stderr = before
        _repoint_back(moved, before)
        for stream in (out, err):
            if stream not in (sys.stdout, before):
                stream.close()  # the copies of the descriptors


def _on(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False


def _writer(fd: int, like: TextIO) -> TextIO:
    """A line-buffered text stream on ``fd`` (a copy of the terminal's), with ``like``'s encoding."""
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=True), encoding=getattr(like, "encoding", None) or "utf-8",
                            errors=getattr(like, "errors", None) or "strict", line_buffering=True, write_through=True)


def _handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers]


def _repoint(old: TextIO, new: TextIO) -> list[logging.StreamHandler]:
    """The console handlers writing to ``old`` (Prefect's, MLflow's) write to ``new``; the ones moved."""
    moved = [h for h in _handlers() if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
             and h.stream is old]
    _repoint_back(moved, new)
    return moved


def _repoint_back(moved: list[logging.StreamHandler], stream: TextIO) -> None:
    """Each of ``moved`` writes to ``stream`` (Prefect's console handler through its rich Console too)."""
    for handler in moved:
        handler.setStream(stream)
        console = getattr(handler, "console", None)
        if console is not None and hasattr(console, "file"):
            console.file = stream
