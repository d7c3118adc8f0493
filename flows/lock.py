"""One process per job: the job folder's ``lock`` (its holder's host, pid and flow run), taken over from a dead
holder on this host."""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from prefect_hyperband.trainers.errors import InputError


def lock_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / "lock"


def _holder(job_dir: str | Path) -> dict[str, Any] | None:
    """Who holds the job's lock, if a live process does (a dead one's lock on this host is stale)."""
    try:
        holder = json.loads(lock_path(job_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"host": "?", "pid": "?"}  # being written this instant: held
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return None
        except (PermissionError, ValueError, KeyError):
            pass
    return holder


def check_free(job_dir: str | Path, job_id: str) -> None:
    """``InputError`` naming the holder when another process runs this job."""
    holder = _holder(job_dir)
    if holder is not None:
        raise InputError(f"job {job_id!r} is already running (host {holder.get('host')}, pid {holder.get('pid')}); "
                         "wait for it to end, or stop it, before running it again")


@contextmanager
def job_lock(job_dir: str | Path, job_id: str, **about: str) -> Iterator[dict[str, Any] | None]:
    """One process per job: held while the job runs; a stale lock of a dead process on this host is taken over.

    The lock records this process's host and pid and ``about`` (the job's flow run); it yields what a dead holder
    recorded (its flow run, left running when its machine or process was lost), None when the lock was free."""
    path = lock_path(job_dir)
    me = {"host": socket.gethostname(), "pid": os.getpid(), **about}
    stale: dict[str, Any] | None = None
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_free(job_dir, job_id)
            try:
                stale = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    try:
        yield stale
    finally:
        path.unlink(missing_ok=True)
