"""A ``hyperband worker``'s trial-rungs as it stops: those it runs, or took and has not begun, handed back to their jobs.

In a worker's process only (``flows.task_workers.trial_rung`` notes each run; ``app.worker`` hands them back at its
stop). A run is handed back or leaves its result, never both: ``ending`` (the run's last step, its result written)
and ``hand_back``'s marks hold one lock, so a run whose result is written is not marked ``Crashed`` after it (its job
would keep the result and the worker would count it handed back), and one marked leaves no result.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from prefect_hyperband.trainers import stopping

#: seconds a stopping worker waits for the trial-rungs it handed back to end (each at its next unit), and what their
#: task runs' state says
HAND_BACK_WAIT = 15.0
HANDED_BACK = "its hyperband worker stopped: the job runs it again"
#: the latest run ids whose result was written (``ending``): Prefect's engine ends such a run after our function
#: returned, still a taken one of the worker's meanwhile, and it is not handed back; the oldest forgotten past
#: ``RETURNED_KEPT`` (a worker lives for months: not growing)
RETURNED_KEPT = 4096

#: the task runs this worker runs now, with their stop tokens; those whose result was written; the lock of both
_running: dict[str, stopping.StopToken] = {}
_returned: dict[str, None] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def running(run_id: str, token: stopping.StopToken) -> Iterator[None]:
    """The run ``run_id`` is this worker's, training under ``token``, for the block."""
    _running[run_id] = token
    try:
        yield
    finally:
        _running.pop(run_id, None)


@contextlib.contextmanager
def ending(run_id: str) -> Iterator[str | None]:
    """The run's last step (its result written), no hand-back marking it meanwhile: yields why it was given up
    (``given_up``) or None, when the block writes its result; the run is then never handed back."""
    with _lock:
        why = given_up(run_id)
        yield why
        if why is None:
            _returned[run_id] = None
            while len(_returned) > RETURNED_KEPT:
                del _returned[next(iter(_returned))]


def given_up(run_id: str) -> str | None:
    """Why the controller gave this task run up (``Crashed``: taken for dead; ``Cancelled``: sent again, or the job
    stopping), or None while it has not."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_task_run(run_id).state
    if state is None or state.type.value not in ("CRASHED", "CANCELLED"):
        return None
    return state.message or f"marked {state.type.value.title()}"


def hand_back(why: str = HANDED_BACK, wait: float = HAND_BACK_WAIT, taken: Any = (), besides: Any = ()) -> list[str]:
    """The task runs this worker runs now marked ``Crashed`` (``why``), as it stops, and those it took from the server
    and had not begun (``taken``: its ``TaskWorker``'s, ``prefect_internals.remembering_taken``; the server sends a
    taken run to no other worker), leaving out those whose result is written. Their jobs run those trial-rungs again
    at once, not a heartbeat timeout later (a late result is refused: ``ending``). Their trainings are asked to stop,
    and waited for up to ``wait`` seconds (each ends at its next unit). The runs handed back, leaving out those in
    ``besides`` (handed back already)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with _lock:
        held, skip = dict(_running), {str(run) for run in besides} | set(_returned)
        runs = [run for run in [*held, *({str(run) for run in taken} - set(held))] if run not in skip]
        if runs:
            with get_client(sync_client=True) as client:
                for run_id in runs:
                    try:
                        client.set_task_run_state(UUID(run_id), Crashed(message=why), force=True)
                    except Exception:  # noqa: BLE001  (the server away: the job takes the run for dead by its beat)
                        pass
                    if run_id in held:
                        held[run_id].request(reason=why)
    ends = time.monotonic() + wait
    while _running and time.monotonic() < ends:
        time.sleep(0.1)
    if held:  # Prefect's engine sends each one's end after our function returns: a second, before the process ends
        time.sleep(min(1.0, wait))
    return runs
