"""Which task worker holds a trial-rung's task run, and whether that worker is gone: a killed worker noticed in
seconds, not after a timeout.

A ``hyperband worker`` started with ``--storage`` writes a claim as it takes a task run from the server
(``claims/<task run id>.json`` in that storage, before it waits for a free slot): its identifier on the server
(Prefect's ``<machine>-<pid>``). A trial-rung that trains beats in the job's storage with the same identifier
(``work_pool.heartbeat``). The job reads the Prefect server's list of connected task workers (``Roster``, one request
a second for all of its trial-rungs): the server re-lists a connected worker every second and drops it once its
socket is closed, so a worker missing from the list at every look over ``GONE_SECONDS`` is gone (a SIGKILL closes its
socket at once); its trial-rungs, SCHEDULED, PENDING or RUNNING, run again then. A worker that is listed is never
taken for dead here, whatever its trainings' pace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prefect_hyperband.flows.worker_slots import SLOTS_MARK, serving

#: seconds a worker must be missing from the server's list, at every look, to be gone
GONE_SECONDS = 3.0
#: seconds between reads of the server's list (shared by a job's trial-rungs)
READ_EVERY = 1.0
#: where a worker's claims on task runs are, in its ``--storage``
CLAIMS = "claims"


def identifier(listed: str) -> str:
    """A worker's own identifier (Prefect's ``<machine>-<pid>``) from the server's (which may end in its slots)."""
    return listed.split(SLOTS_MARK, 1)[0]


def claim_key(run_id: Any) -> str:
    return f"{CLAIMS}/{run_id}.json"


class Roster:
    """The task workers the Prefect server lists, read at most every ``READ_EVERY`` seconds (``read()``: their
    identifiers; an error: not read), and for each worker asked about, since when it has been missing."""

    def __init__(self, read: Callable[[], set[str]] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.read, self.clock = read or _listed, clock
        self.listed: set[str] | None = None
        self.at = -float("inf")
        self.missing: dict[str, tuple[float, int]] = {}  # worker -> (first look it was missing, looks since)
        self.lock = threading.Lock()

    def gone(self, worker: str) -> str | None:
        """Why ``worker`` is gone (a sentence), or None while it is listed or not surely gone."""
        with self.lock:
            now = self.clock()
            if now - self.at >= READ_EVERY:
                try:
                    self.listed = {identifier(w) for w in self.read()}
                except Exception:  # noqa: BLE001  (the server away: no sign of anything; the job's reads wait for it)
                    self.listed = None
                self.at = now
                for name, (since, looks) in list(self.missing.items()):
                    if self.listed is not None and name in self.listed:
                        del self.missing[name]  # back (or never gone): the clock starts again
                    elif self.listed is not None:
                        self.missing[name] = (since, looks + 1)
            if self.listed is None:
                return None
            if worker in self.listed:
                self.missing.pop(worker, None)
                return None
            since, looks = self.missing.setdefault(worker, (now, 1))
            if now - since >= GONE_SECONDS and looks >= 3:
                return f"its worker {worker} left the Prefect server's task workers ({now - since:.0f} s ago)"
            return None


def _listed() -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(sync_client=True) as client:
        return set(serving(client))


#: the job process's one roster (its trial-rungs' threads share its reads)
ROSTER = Roster()


class Holder:
    """The worker that holds one trial-rung's task run, as its claim (with ``--storage``) or its heartbeat says;
    looked for at most once a second."""

    def __init__(self, claims: Any, beats: Any, run_id: Any, beat_key: str) -> None:
        self.claims, self.beats, self.run_id, self.beat_key = claims, beats, run_id, beat_key
        self.worker: str | None = None
        self.at = -float("inf")

    def gone(self, roster: Roster = ROSTER) -> str | None:
        """Why the holder is gone, or None (no holder known yet, or it is there)."""
        now = time.monotonic()
        if self.worker is None and now - self.at >= READ_EVERY:
            self.at = now
            self.worker = self._look()
        return roster.gone(self.worker) if self.worker else None

    def _look(self) -> str | None:
        for store, key in ((self.claims, claim_key(self.run_id)), (self.beats, self.beat_key)):
            if store is None:
                continue
            try:
                found = store.read_json(key)
            except Exception:  # noqa: BLE001  (the storage did not answer: looked for again)
                continue
            if isinstance(found, dict) and found.get("worker"):
                return str(found["worker"])
        return None
