"""One process per job: the job folder's ``lock`` (its holder's host, pid and flow run), kept fresh while the job
runs and taken over from a dead holder: on this host when its process is gone, from another host (a job folder on
a shared filesystem, a controller machine lost) when the lock has not been refreshed for ``STALE_AFTER`` seconds."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect_hyperband.common.errors import InputError

#: seconds between two refreshes of a held lock's modification time
HEARTBEAT = 20.0
#: a lock of another host not refreshed for this long is stale: its holder (or its machine) is gone. Several
#: heartbeats, so that a busy or briefly paused holder is not taken for dead; the hosts' clocks are assumed to
#: agree within a minute (NTP), since the lock's age is the file's time against this host's clock.
STALE_AFTER = 180.0


def lock_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / "lock"


def _read(path: Path) -> dict[str, Any] | None:
    """The lock's holder as it recorded itself, with ``silent``, the lock's age (seconds since its last refresh);
    None when there is no lock."""
    try:
        holder = json.loads(path.read_text())
        holder["silent"] = max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"host": "?", "pid": "?"}  # being written this instant: held
    return holder


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder still runs: on this host, its process; on another host, a lock refreshed within
    ``STALE_AFTER`` seconds."""
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError, KeyError):
            pass
        return True
    return holder.get("silent", 0.0) <= STALE_AFTER


def _holder(job_dir: str | Path) -> dict[str, Any] | None:
    """Who holds the job's lock, if a live process does (``_alive``)."""
    holder = _read(lock_path(job_dir))
    return holder if holder is not None and _alive(holder) else None


def check_free(job_dir: str | Path, job_id: str) -> None:
    """``InputError`` naming the holder when another process runs this job."""
    holder = _holder(job_dir)
    if holder is not None:
        raise _busy(job_id, holder)


def _busy(job_id: str, holder: dict[str, Any]) -> InputError:
    seen = f", its lock refreshed {holder['silent']:.0f} s ago" if holder.get("host") != socket.gethostname() \
        and "silent" in holder else ""
    return InputError(f"job {job_id!r} is already running (host {holder.get('host')}, pid {holder.get('pid')}{seen}); "
                      "wait for it to end, or stop it, before running it again")


def took_over(stale: dict[str, Any] | None) -> str | None:
    """The line a job says when it took over another host's lock (None for this host's dead process: said by the
    lost runs it ends, if any)."""
    if not stale or stale.get("host") in (None, socket.gethostname()):
        return None
    return (f"took over the job's lock from host {stale.get('host')} (pid {stale.get('pid')}): not refreshed for "
            f"{stale.get('silent', 0):.0f} s, so its process or machine is gone")


def keep_fresh(path: Path, stop: threading.Event, every: float = HEARTBEAT) -> None:
    """Refresh the lock's modification time every ``every`` seconds until ``stop`` is set (a thread's body)."""
    while not stop.wait(every):
        try:
            os.utime(path)
        except OSError:
            pass  # the folder's filesystem away for a moment: the next beat tries again


@contextmanager
def job_lock(job_dir: str | Path, job_id: str, **about: str) -> Iterator[dict[str, Any] | None]:
    """One process per job: held (and refreshed every ``HEARTBEAT`` seconds) while the job runs; a stale lock is
    taken over.

    The lock records this process's host and pid and ``about`` (the job's flow run); it yields what a dead holder
    recorded (its flow run, left running when its machine or process was lost, and ``silent``, its lock's age),
    None when the lock was free."""
    path = lock_path(job_dir)
    me = {"host": socket.gethostname(), "pid": os.getpid(), **about}
    stale: dict[str, Any] | None = None
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            found = _read(path)  # read once: who holds it, and for how long it has been silent
            if found is not None and _alive(found):
                raise _busy(job_id, found) from None
            stale = found or stale
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    stop = threading.Event()
    beat = threading.Thread(target=keep_fresh, args=(path, stop), name="hyperband-lock", daemon=True)
    beat.start()
    try:
        yield stale
    finally:
        stop.set()
        beat.join(timeout=5)
        path.unlink(missing_ok=True)
