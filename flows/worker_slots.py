"""Which of the Prefect server's task workers serve a job's trial-rung task, and the slots they offer.

A job's trial-rungs go to the workers of its task key (``task_workers.served``): Prefect's key of the task, its name
(which holds a digest of the storage its parameters travel through, ``storage_digest``) and a hash of its code, so
that a worker that cannot read them never receives them (before, it failed each one). A ``hyperband worker``'s
identifier on the server ends in ``SLOTS_MARK`` and its ``--limit`` (``app.worker``), so that a job without
``--concurrency`` keeps as many trial-rungs in flight as its workers take at once."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect_hyperband.executors.storage import is_local

#: how ``who_serves`` begins when some worker serves the job's code
SERVED = "workers serve this code"
#: seconds between counts of the workers serving the job's code (``LiveSlots``)
SLOTS_EVERY = 5.0
#: how a hyperband worker's identifier on the Prefect server ends: the slots it offers (``slots_of``)
SLOTS_MARK = "~slots="
#: between the trial-rung task's name and its storage's digest, in its function's name (``task_workers.served``)
STORE_SEP = "_on_"
def storage_digest(storage: str | None) -> str:
    """A short name for the storage a job's trial-rungs' parameters travel through (``--storage``, as
    ``storage_name`` writes it; None: Prefect's task-scheduling storage), part of their task's key."""
    return hashlib.sha256(storage_name(storage).encode()).hexdigest()[:12] if storage else "prefect"


def storage_name(storage: str | None) -> str:
    """``--storage`` as every machine names it: a local path absolute (``file://`` dropped), a URL as given."""
    if not storage:
        return ""
    return str(Path(storage.removeprefix("file://")).resolve()) if is_local(storage) else storage


def serving(client: Any) -> dict[str, list[str]]:
    """The task workers the Prefect server knows, each with the task keys it serves (``/task_workers/filter``)."""
    response = client.request("POST", "/task_workers/filter", json={})
    return {w["identifier"]: list(w["task_keys"]) for w in response.json()}


def who_serves(client: Any, task_key: str, storage: str | None = None) -> str:
    """One sentence: which workers serve ``task_key`` (this code's, reading ``storage``), and which serve the
    trial-rung task of this code with another storage, or of other code."""
    try:
        workers = serving(client)
    except Exception as exc:  # noqa: BLE001  (a sentence for a warning: the server did not answer)
        return f"the Prefect server did not list its task workers ({type(exc).__name__})"
    ours = [w for w, keys in workers.items() if task_key in keys]
    name, _, code = task_key.rpartition("-")  # Prefect's key: the function's name, a hash of its code
    family = name.split(STORE_SEP, 1)[0]  # the trial-rung task, whatever its storage
    same_code = [w for w, keys in workers.items() if task_key not in keys
                 and any(k.startswith(family) and k.endswith(f"-{code}") for k in keys)]
    other = [w for w, keys in workers.items() if task_key not in keys and w not in same_code
             and any(k.startswith(family) for k in keys)]
    if ours:
        return f"{SERVED}: {len(ours)} worker(s) serve it"
    if same_code:
        flag = f"--storage {storage}" if storage else "no --storage (Prefect's task-scheduling storage)"
        return (f"{len(same_code)} hyperband worker(s) read other storage than this job's trial-rungs travel through: "
                f"start `hyperband worker{' --storage ' + storage if storage else ''}` ({flag}) where it is "
                "reachable; the trial-rungs wait for it")
    if other:
        return (f"{len(other)} hyperband worker(s) serve other code (task key {task_key} here): start `hyperband "
                "worker` from the same version of prefect-hyperband as the job's")
    return "no hyperband worker is connected to this Prefect server: start `hyperband worker` on a machine"


class LiveSlots:
    """A job's slots on task workers: those the workers serving its code offer (``slot_count``), counted again every
    ``SLOTS_EVERY`` seconds (a worker started mid-job takes work at once; one that leaves gives its slots back).
    Between counts, and while the server does not answer, the last count."""

    def __init__(self, first: int, count: Callable[[], int] | None = None) -> None:
        self.value, self.count, self.at = max(1, first), count or slot_count, time.monotonic()

    def __call__(self) -> int:
        from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

        if time.monotonic() - self.at >= SLOTS_EVERY:
            self.at = time.monotonic()
            try:  # asked from the loop's thread: no silent retries of a server that does not answer
                with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}):
                    self.value = self.count()
            except Exception:  # noqa: BLE001  (the server away: the job's reads say so; the slots stay as they were)
                pass
        return self.value


def slots_of(identifier: str) -> int:
    """The trial-rungs a task worker takes at once, from its identifier on the server (``app.worker``'s ends in
    ``SLOTS_MARK`` and its ``--limit``); one for a worker that says none (no ``--limit``, or Prefect's own)."""
    head, _, n = identifier.rpartition(SLOTS_MARK)
    return int(n) if head and n.isdigit() and int(n) > 0 else 1


def slot_count(task_key: str) -> int:
    """The slots the task workers serving ``task_key`` (a job's: ``task_workers.key_of``) offer now (the job's default
    concurrency, at least 1): each worker's ``--limit``, or one."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return max(1, sum(slots_of(w) for w, keys in serving(client).items() if task_key in keys))
