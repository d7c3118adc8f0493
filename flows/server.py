"""A Prefect server on the job's own machine: its event consumers write in batches, and on SQLite a new task run or
flow run does not wait 2 s for a write that raced it.

Every task run sends its state changes to the server as events (Pending, Running, Completed): about
six per trial-rung. Prefect's task-run recorder writes them to the database one event per
transaction by default (``batch_size`` 1), compiling a fresh SQLAlchemy upsert each time. A
temporary server on a 2-core machine then spent about as much CPU as the job itself (measured with
psutil around the default-shaped job: 12.1 s of server CPU for 16.8 s of the job's). In batches of
up to 200, flushed every second, the same job cost it 4.6 s, and the UI shows a task run at most a
second later. The event persister (the UI's event feed) gets the same batches (its default: 20, or
every 5 s).

Applied to the temporary server the CLI starts, and to the test suite's and the benchmarks'; for a
server you run yourself, set the same variables where it starts (docs/operations.md, "1. Prefect server").

On SQLite, Prefect's server creates a task run (a subflow's, as each bracket's ``hyperband-group``) or a flow run
by reading first (the parent's labels) and then inserting, in one transaction begun DEFERRED. When another
writer commits in between (the task-run recorder's batch, a log write), SQLite refuses the read's upgrade to a
write at once (SQLITE_BUSY_SNAPSHOT; its busy timeout does not apply), the server answers 503 and Prefect's client
tries again after 2 s: measured, a default-shaped synthetic job (R=9, 22 trial-rungs, a test server) took 9.2-10.3 s,
most of it trial-rungs waiting for their bracket's subflow run. ``create_app`` is Prefect's application with those
two POSTs begun IMMEDIATE (the write lock first, waited for under the busy timeout, as Prefect's own orchestration
does): the same jobs took 5.3-5.4 s, and no 503 was answered. The temporary servers started here (the CLI's, the
Python API's, the test suite's, the benchmarks') run it; Prefect is pinned, and the patch is ``tasks.prefect_internals``'s
(``tests/tasks/test_prefect_internals.py`` checks the internals it relies on).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from prefect_hyperband.tasks.prefect_internals import sqlite_begin_immediate

BATCHED_WRITES = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
}


def batch_server_writes() -> None:
    """``BATCHED_WRITES`` into this process's environment (a value already set wins): a Prefect server it
    starts afterwards inherits them."""
    for name, value in BATCHED_WRITES.items():
        os.environ.setdefault(name, value)


#: the uvicorn factory Prefect starts its temporary server with, and ours in its place
PREFECTS_APP = "prefect.server.api.server:create_app"
OUR_APP = "prefect_hyperband.flows.server:create_app"
#: the POSTs whose handler reads and then inserts: a new task run, a new flow run
READ_THEN_INSERT = ("/api/task_runs", "/api/flow_runs")

_immediate: ContextVar[bool] = ContextVar("hyperband_sqlite_immediate", default=False)


def create_app() -> Any:
    """Prefect's server application (``PREFECTS_APP``, its settings from the environment), where on SQLite the
    ``READ_THEN_INSERT`` requests begin their transaction IMMEDIATE (see the module's notes)."""
    from prefect.server.api.server import create_app as prefects

    sqlite_begin_immediate(_immediate.get)
    app = prefects()

    async def asgi(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        inserts = scope["type"] == "http" and scope["method"] == "POST" and scope["path"].rstrip("/") in READ_THEN_INSERT
        if not inserts:
            return await app(scope, receive, send)
        token = _immediate.set(True)
        try:
            await app(scope, receive, send)
        finally:
            _immediate.reset(token)

    return asgi


def with_our_app(popen: Callable[..., Any]) -> Callable[..., Any]:
    """``popen`` (``subprocess.Popen``, as Prefect's ``SubprocessASGIServer`` calls it) starting ``OUR_APP`` where
    Prefect asks for ``PREFECTS_APP``."""

    def ours(argv: list[str]) -> list[str]:
        return [OUR_APP if a == PREFECTS_APP else a for a in argv]

    def start(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (ours(args[0]), *args[1:])
        elif "args" in kwargs:
            kwargs["args"] = ours(kwargs["args"])
        return popen(*args, **kwargs)

    return start
