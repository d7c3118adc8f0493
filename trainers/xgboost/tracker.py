"""XGBoost's tracker for one collective, in a process of its own on the Dask scheduler's machine.

``xgboost.dask`` starts its ``RabitTracker`` in a thread of the Dask scheduler's process. When a worker dies in the
middle of a collective, the tracker's C++ thread can throw where nothing catches it (xgboost 3.2: "terminate called
after throwing an instance of 'dmlc::Error' ... send system error: Connection reset by peer"), and that aborts the
process it lives in: the user's scheduler, or the job's own process under a ``LocalCluster``. Here the scheduler
keeps one helper process (``python -m prefect_hyperband.trainers.xgboost.tracker``, XGBoost imported once) that
forks a child per collective: the child starts the tracker, answers with its workers' arguments and waits for the
collective's end. A child that aborts takes only its own collective with it; the group's ranks see their peer or
tracker gone, and the job runs the trial-rung again on another group.

A tracker whose collective never ends (its ranks abandoned without a word to it) lives on as an idle child until the
helper ends; the helper ends when its scheduler does (its stdin closes), and its children within ``ORPHAN_POLL``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Any

#: in the scheduler's process only: the helper that forks the trackers, started at the first collective
_helper: subprocess.Popen | None = None
_lock = threading.Lock()

#: seconds between a tracker's looks at whether its helper (and so its scheduler) is still there
ORPHAN_POLL = 5.0


def warm() -> None:
    """On the scheduler: the helper started now, if it is not running (its import of XGBoost, about a second,
    overlaps the job's loading of a group's data rather than delaying the first collective)."""
    with _lock:
        _started()


def _started() -> subprocess.Popen:
    global _helper
    if _helper is None or _helper.poll() is not None:
        _helper = subprocess.Popen([sys.executable, "-m", "prefect_hyperband.trainers.xgboost.tracker"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    return _helper


def worker_args(n_workers: int, host: str) -> dict[str, Any]:
    """On the scheduler (``client.run_on_scheduler``): a new tracker for ``n_workers`` ranks, listening on ``host``;
    returns the arguments its ranks pass to ``xgboost.collective.CommunicatorContext``. The helper is started
    again where it ended."""
    with _lock:
        helper = _started()
        assert helper.stdin is not None and helper.stdout is not None
        try:
            helper.stdin.write(json.dumps([n_workers, host]) + "\n")
            helper.stdin.flush()
            line = helper.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
    if not line:
        raise RuntimeError(f"XGBoost's tracker process ended (exit code {helper.poll()}); the next collective starts "
                           "it again")
    answer = json.loads(line)
    if "error" in answer:
        raise RuntimeError(f"XGBoost's tracker did not start on {host}: {answer['error']}")
    return answer


def serve(requests: IO[str], answers: IO[str]) -> None:
    """The helper's loop: for each request line ``[n_workers, host]``, a forked child starts the tracker, writes its
    workers' arguments as one JSON line (or ``{"error": ...}``) and waits for the collective's end."""
    from xgboost.tracker import RabitTracker

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped as they end
    helper = os.getpid()
    for line in requests:
        n_workers, host = json.loads(line)
        if os.fork() != 0:
            continue
        try:  # the child: one tracker
            tracker = RabitTracker(n_workers=n_workers, host_ip=host, sortby="task")
            tracker.start()
            answer = tracker.worker_args()
        except Exception as exc:  # a port or host that does not bind: said to the scheduler
            answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            answers.flush()
            os._exit(1)
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
        _detach()
        waiting = threading.Thread(target=tracker.wait_for, daemon=True)
        waiting.start()
        while waiting.is_alive() and os.getppid() == helper:  # an orphan (its helper gone) ends too
            waiting.join(ORPHAN_POLL)
        os._exit(0)


def _detach() -> None:
    """A child closes its copies of the helper's pipes: the scheduler reads an end of file when the helper dies,
    whatever its children do."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
