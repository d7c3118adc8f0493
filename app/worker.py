"""``hyperband worker``: a Prefect task worker that takes the trial-rungs of ``hyperband tune --task-workers`` jobs.

It serves the trial-rung task (``flows.task_workers.trial_rung``: train, then evaluate, as a local trial-rung)
on the Prefect server at ``PREFECT_API_URL`` (what it is sent at once, or ``--limit``), and keeps its trainers between them
(the data loaded once per job's settings, a torch pool kept). SIGTERM and Ctrl-C stop it: the trial-rungs it holds
are marked Crashed on the server as it goes, and their jobs run them again at once (a worker killed outright: once
their heartbeats stop).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time

from prefect_hyperband.common.errors import first_line
from prefect_hyperband.flows.worker_slots import SLOTS_MARK
from prefect_hyperband.flows.worker_watch import claim_key, identifier
from prefect_hyperband.tasks.prefect_internals import remembering_taken

#: seconds a stopping worker waits for its subscription to end (its socket closed) before it hands back what it took
CLOSE_WAIT = 5.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser("worker", help="serve the trial-rungs of --task-workers jobs (a Prefect task worker)")
    worker.add_argument("--limit", type=int, default=0, help="at most this many trial-rungs at once here (default 0: "
                        "what it is sent; the job's --concurrency bounds them): Prefect's task worker takes a run "
                        "off the server before it has a free slot, so a run sent to a full worker waits there "
                        "while others may be free")
    worker.add_argument("--storage", metavar="PATH|URL", help="the jobs' --storage (a folder every machine mounts, "
                        "or s3://...): their trial-rungs' parameters travel there; without it, Prefect's "
                        "task-scheduling storage (PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK)")


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then hand back the trial-rungs it holds (``hand_back.hand_back``); one line
    and exit 2 without a Prefect server to serve."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # its own log lines outside a task run have no flow run to go to (a task run's carry the job's settings, which
    # say the same: ``task_workers._outside_runs``)
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    from prefect.settings import PREFECT_API_URL

    if args.limit < 0:
        print(f"hyperband: error: --limit must be >= 0, got {args.limit}", file=sys.stderr)
        return 2
    if not PREFECT_API_URL.value():
        print("hyperband: error: a worker serves the Prefect server its jobs use: set PREFECT_API_URL "
              "(http://host:4200/api)", file=sys.stderr)
        return 2
    from prefect_hyperband.app import terminal
    from prefect_hyperband.flows import hand_back, task_workers, worker_slots
    from prefect_hyperband.trainers import factory

    def stop(signum, frame):  # noqa: ARG001  (a signal handler's signature)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    terminal.quiet_stops()  # the trainings its stop ends: no error tracebacks
    trainers = factory.Trainers()
    task_workers._warm.append(trainers)
    unreadable = _unreadable(args.storage)
    if unreadable:
        print(f"hyperband: error: --storage {args.storage}: {unreadable}", file=sys.stderr)
        return 2
    served = task_workers.served(args.storage)
    where = worker_slots.storage_name(args.storage) if args.storage else \
        "Prefect's task-scheduling storage (no --storage: jobs started without --storage)"
    print(f"hyperband: worker serving {task_workers.TASK_NAME} on {PREFECT_API_URL.value()}, "
          f"{args.limit or 'what it is sent'} at once, parameters from {where} (task key {served.task_key})",
          file=sys.stderr, flush=True)
    worker: list = []  # the TaskWorker, once made: the runs it took and has not begun are handed back too
    try:
        _serve(served, args.limit, worker, _claims(args.storage))
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C; SIGTERM (Prefect's task worker handles it, and exits)
        pass
    finally:
        if worker:  # it begins no run from now on, and none reaches it once its subscription is closed
            worker[0].close_subscription(timeout=CLOSE_WAIT)
        held = hand_back.hand_back(taken=_taken(worker))
        held += hand_back.hand_back(taken=_taken(worker), wait=0, besides=held)  # (had the close not ended it)
        _ended(worker, hand_back.HAND_BACK_WAIT)
        task_workers._warm.clear()
        trainers.close_all()
    print(f"hyperband: worker stopped; {len(held)} trial-rung(s) it ran handed back to their jobs", file=sys.stderr,
          flush=True)
    return 0


def _taken(worker: list) -> list:
    """The task runs the worker took from the server and holds, begun or waiting for a slot
    (``prefect_internals.remembering_taken``)."""
    for _ in range(3):  # its event loop's thread changes the set: a copy that raced it is taken again
        try:
            return list(worker[0].taken) if worker else []
        except RuntimeError:
            continue
    return []


def _ended(worker: list, wait: float) -> None:
    """Until Prefect's engine has ended every run the worker began (up to ``wait`` seconds): a run still ending as the
    process exits logs and emits its end after Python's shutdown began (a traceback per line, "can't register atexit
    after shutdown")."""
    ends = time.monotonic() + wait
    while worker and worker[0].begun and time.monotonic() < ends:
        time.sleep(0.1)


def _unreadable(root: str | None) -> str | None:
    """Why the worker cannot use ``root`` (its ``--storage``), or None: a file written, read back and deleted."""
    if not root:
        return None

    key = f"claims/probe-{os.uname().nodename}-{os.getpid()}.json"
    try:
        store = _claims(root)
        store.write_json(key, {"probe": True})
        readable = store.read_json(key) == {"probe": True}
        store.delete(key)
    except Exception as exc:  # noqa: BLE001  (one line: the storage is the user's to fix)
        return f"cannot write and read it here ({type(exc).__name__}: {first_line(exc)})"
    return None if readable else "a file written there does not read back"


def _claims(root: str | None):
    """Where the worker notes the task runs it takes (``flows.worker_watch``): its ``--storage``; None without."""
    if not root:
        return None

    from prefect_hyperband.executors.job import storage_at

    return storage_at(root, tempfile.gettempdir())


def _serve(served: object, limit: int, worker: list, claims=None) -> None:
    """Prefect's ``task_worker.serve`` with ``_slots_worker()`` for its ``TaskWorker``: on an event loop of its own, in
    a thread as ``serve``'s is (so that SIGTERM and Ctrl-C reach this thread, not the worker's), until it stops."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(_aserve(served, limit, worker, claims))
        except BaseException as exc:  # noqa: BLE001  (raised again in the calling thread)
            failed.append(exc)

    thread = threading.Thread(target=run, name="hyperband-worker", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if failed:
        raise failed[0]


async def _aserve(served: object, limit: int, made: list, claims=None) -> None:
    """What ``prefect.task_worker.aserve`` does, with ``_slots_worker()``: a stop (Prefect's ``StopTaskWorker``, a
    cancel, an interrupt, alone or in the exception group its task group raises) ends it quietly."""
    from prefect.task_worker import StopTaskWorker

    worker = _slots_worker(claims)(served, limit=limit or None)  # (a TaskWorker is made inside its event loop)
    made.append(worker)
    try:
        await worker.astart()
    except BaseExceptionGroup as group:  # noqa: F821  (a builtin of Python 3.11)
        _, unexpected = group.split((StopTaskWorker, asyncio.CancelledError, KeyboardInterrupt, TimeoutError))
        if unexpected is not None:
            raise unexpected from None
    except (StopTaskWorker, asyncio.CancelledError):
        pass


def _slots_worker(claims=None) -> type:
    """Prefect's ``TaskWorker`` whose identifier on the server (``client_id``: ``<machine>-<pid>``) ends in the slots it
    offers, ``~slots=<--limit>`` (``flows.worker_slots``): a job counts its workers' slots from the server's list.
    With ``claims`` (its ``--storage``), it notes each task run it takes there as it takes it, before it waits for a
    slot (``flows.worker_watch``): a job whose run it holds knows it is gone as soon as the server does."""
    from prefect.task_worker import TaskWorker

    class SlotsWorker(remembering_taken(TaskWorker)):  # type: ignore[misc]
        @property
        def client_id(self) -> str:
            return f"{super().client_id}{SLOTS_MARK}{self.limit}" if self.limit else super().client_id

        async def note_taken(self, task_run_id) -> None:
            if claims is not None:
                try:
                    await asyncio.to_thread(claims.write_json, claim_key(task_run_id),
                                            {"worker": identifier(self.client_id)}, None)
                except Exception:  # noqa: BLE001  (no claim: the job goes by its heartbeat, as before)
                    pass

    return SlotsWorker
