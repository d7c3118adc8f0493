"""Settings for a Prefect server on the job's own machine: its event consumers write in batches.

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
"""

from __future__ import annotations

import os

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
