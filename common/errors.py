"""Errors a person can act on: the CLI prints them as one line and exits 2."""

from __future__ import annotations

import errno
import math
import os
import shutil
import sys
from collections.abc import Callable

from pydantic import ValidationError


class InputError(ValueError):
    """Bad user input (a flag, a data file, a search space); its message names the fix."""


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds the user set in the environment variable ``name`` (``default`` when unset); a value
    that is not a positive number is an ``InputError`` naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise InputError(f"{name}={raw!r}: not a number of seconds above 0 (unset, it is {default:g})")
    return value


def on_stderr(text: str) -> None:
    """One line on stderr, ``hyperband: text``: what the CLI says outside a flow run (a slow server's start, a damaged
    file read before a job's flow run begins)."""
    print(f"hyperband: {text}", file=sys.stderr, flush=True)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message cut to its first line (at most ``limit`` characters): for a one-line error."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


#: the longest error a trial's warning line shows (its task run's traceback in job.log and the UI keeps it whole)
SHOWN_CHARS = 2000


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for a terminal line: control characters (a script's NUL, escape sequences) written as Python writes
    them in a string's repr (``\\x1b``), newlines and tabs kept; past ``limit`` characters cut, saying so."""
    text = "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut at {limit:,} characters; the whole error is in the task run's log and job.log)"


#: what libraries say instead of raising ``OSError(ENOSPC)``: SQLite, XGBoost and torch's writers, C++ streams
_FULL_WORDS = ("no space left on device", "database or disk is full", "disk quota exceeded")


def causes(exc: BaseException | None, limit: int = 20):
    """The error, then each one it came from (``__cause__``, else ``__context__``), at most ``limit``."""
    while exc is not None and limit > 0:
        yield exc
        exc, limit = exc.__cause__ or exc.__context__, limit - 1


def no_space(exc: BaseException | None) -> bool:
    """The error, or one it came from, is a full disk (``ENOSPC``, ``EDQUOT``, or a library's words for it)."""
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
               or any(words in str(e).lower() for words in _FULL_WORDS) for e in causes(exc))


def full_disk(path: str) -> str:
    """The reason a job stops on a full disk: the path it could not write and the space its filesystem has."""
    where = os.path.abspath(path)
    while where and not os.path.exists(where):
        where = os.path.dirname(where)
    try:
        usage = shutil.disk_usage(where or "/")
        space = f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.1f} MiB"
    except OSError:
        space = "its free space unknown"
    return f"no space left on device writing {path} ({space})"


#: a service that did not answer: a connection refused or lost, a timeout, 5xx past the client's own retries
_UNAVAILABLE_TYPES = {"ConnectionError", "MaxRetryError", "ConnectError", "ConnectTimeout", "ReadTimeout",
                      "RemoteDisconnected", "NewConnectionError", "ConnectionRefusedError"}
_UNAVAILABLE_WORDS = ("max retries exceeded", "error responses", "connection refused", "service unavailable")


def unavailable(exc: BaseException | None) -> bool:
    """The error, or one it came from, says a server (MLflow's, Prefect's) did not answer or answered 5xx."""
    return any(type(e).__name__ in _UNAVAILABLE_TYPES or any(w in str(e).lower() for w in _UNAVAILABLE_WORDS)
               for e in causes(exc))


def one_line(exc: ValidationError, name: Callable[[str], str] = str, across: Callable[[str], str] = str) -> str:
    """A ``ValidationError`` as one line, each field named by ``name`` (the CLI: its flag) with the value given; a
    check across fields (min over max) as its own message, which names them and the rule (through ``across``)."""
    parts = []
    for error in exc.errors():
        loc = [str(x) for x in error.get("loc", ())]
        message = error.get("msg", "").replace("Value error, ", "")
        value = error.get("input")
        got = f", got {value!r}" if loc and not isinstance(value, (dict, list)) and repr(value) not in message else ""
        parts.append(f"{name(loc[0])}: {message}{got}" if loc else across(message))
    return "; ".join(parts)
