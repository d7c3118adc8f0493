"""Which of the Prefect server's task workers serve a job's trial-rung task (its code's key), and the slots they
offer: a ``hyperband worker``'s identifier on the server ends in ``SLOTS_MARK`` and its ``--limit`` (``app.worker``),
so that a job without ``--concurrency`` keeps as many trial-rungs in flight as its workers take at once."""

from __future__ import annotations

import time
from typing import Any, Callable

#: how ``who_serves`` begins when some worker serves the job's code
SERVED = "workers serve this code"
#: seconds between counts of the workers serving the job's code (``LiveSlots``)
SLOTS_EVERY = 5.0
#: how a hyperband worker's identifier on the Prefect server ends: the slots it offers (``slots_of``)
SLOTS_MARK = "~slots="


def serving(client: Any) -> dict[str, list[str]]:
    """The task workers the Prefect server knows, each with the task keys it serves (``/task_workers/filter``)."""
    response = client.request("POST", "/task_workers/filter", json={})
    return {w["identifier"]: list(w["task_keys"]) for w in response.json()}


def who_serves(client: Any, task_key: str) -> str:
    """One sentence: which workers serve ``task_key`` (this code's), and which the trial-rung task of other code."""
    try:
        workers = serving(client)
    except Exception as exc:  # noqa: BLE001  (a sentence for a warning: the server did not answer)
        return f"the Prefect server did not list its task workers ({type(exc).__name__})"
    ours = [w for w, keys in workers.items() if task_key in keys]
    ours_of_any_code = task_key.rsplit("-", 1)[0] + "-"  # the key: the task function's name, a hash of its code
    other = [w for w, keys in workers.items() if task_key not in keys
             and any(k.startswith(ours_of_any_code) for k in keys)]
    if ours:
        return f"{SERVED}: {len(ours)} worker(s) serve it"
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


def slot_count(task_key: str | None = None) -> int:
    """The slots the task workers serving this code's trial-rung task offer now (the job's default concurrency, at
    least 1): each worker's ``--limit``, or one."""
    from prefect.client.orchestration import get_client

    from prefect_hyperband.executors.task_workers import trial_rung  # (that module sends to the workers it counts)

    key = task_key or trial_rung.task_key
    with get_client(sync_client=True) as client:
        return max(1, sum(slots_of(w) for w, keys in serving(client).items() if key in keys))
