"""Trial-rungs on Prefect's task workers: each one a background task run that a ``hyperband worker`` takes.

``hyperband tune --task-workers`` makes the job flow the controller, as ``--trial-pool`` does, and submits each
trial-rung with ``Task.delay`` (Prefect's background tasks): a long-lived ``hyperband worker`` on any machine
(``prefect.task_worker.serve`` underneath) takes it from the server over a websocket, trains and evaluates it with
the same ``train`` and ``evaluate`` tasks as a local trial-rung, and leaves its result in the job's storage. A
worker keeps its trainers between trial-rungs (the data loaded once, a torch pool kept): no process starts per
trial-rung, which a work pool's flow run pays (13.8 s each, ``benchmarks/bench_trial_pool.py``).

What Prefect leaves to the caller, done here:

- **Liveness.** Delivery is at most once: a task run whose worker dies stays RUNNING, and task runs have no
  heartbeat. The trial-rung beats in the job's storage (``work_pool.heartbeat``); a RUNNING one whose beat stops
  for ``HYPERBAND_HEARTBEAT_TIMEOUT`` seconds is marked Crashed and run again by the loop (a new task run; a late
  one sees its mark and leaves no result), as a work pool's flow run.
- **No cache.** The task's cache key is none (``_NoCache``): a trial-rung submitted again runs again.
- **Taken, never begun.** A task run a worker took and died before beginning stays SCHEDULED or PENDING: one still
  SCHEDULED after ``HYPERBAND_TASK_PICKUP_TIMEOUT`` seconds (120) while workers serve the job's code is cancelled and
  sent again; one PENDING for twice the heartbeat timeout is taken for dead.
- **The API away.** A Prefect API that does not answer is waited for (``api_wait.answering``: one warning line, up to
  ``--service-wait``); a restarted server forgets its queue of task runs (it is in memory), and workers' runs that
  needed the API meanwhile fail: those trial-rungs are sent again (``_AfterOutage``).
- **Code.** A served task's key holds a hash of its code: a worker of other code never receives the job's task
  runs. A trial-rung no worker took within the pickup timeout, with no worker of this code, makes the job say in one
  line which task workers the server knows and whether any serves other code.
- **In the UI.** Each task run is made in the job's flow run, in its rung's group subflow run as a local
  trial-rung's tasks are (``_outside_runs``), named ``<trial> to r=<units>-<key>``; the worker that takes it says which
  machine and process it is in its first log line there.
- **Parameters.** Prefect passes a background task run's parameters through storage: with ``--storage``, the job's
  storage (``<storage>/task-parameters``, ``flows.task_parameters``; the workers are started with the same ``--storage``),
  else Prefect's task-scheduling storage (a local folder, or ``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK``'s). A
  worker that cannot read them deletes the task run (Prefect's default): the job says so and runs the trial-rung again.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
import types
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

from prefect_hyperband.common.errors import seconds_from_env
from prefect_hyperband.executors.job import Job, storage_at
from prefect_hyperband.flows import hand_back, work_pool, worker_slots, worker_watch
from prefect_hyperband.flows.api_wait import answering
from prefect_hyperband.flows.task_parameters import parameter_storage
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.tasks import prefect_internals
from prefect_hyperband.tasks.trials import Evaluation
from prefect_hyperband.trainers import factory, stopping
from prefect_hyperband.trainers.base import TrainResult

TASK_NAME = "hyperband-trial-rung"
#: seconds between reads of a trial-rung's task run (a work pool's flow run is read every 0.5 s: it takes seconds to
#: start; a warm worker finishes a short trial-rung in less)
POLL_SECONDS = 0.2
#: seconds between looks for a trial-rung's result in a folder (``_landed``)
RESULT_LOOK = 0.02
#: Prefect's client's own retries of a request while the trial-rungs wait (its backoff: about 6 s for 2)
API_CLIENT_RETRIES = 2
#: times a trial-rung lost to an outage of the API is sent again before the loop hears of it
OUTAGE_RESENDS = 2
#: seconds a task run may stay PENDING after an outage it was out in (its worker took it, could not begin it without
#: the API: Prefect's "Failed to submit task run", and dropped it); a worker begins one in milliseconds
OUTAGE_PENDING = 15.0
#: what each of the latest ``SAID_JOBS`` jobs said of its workers (``who_serves``): said once per job, not per
#: trial-rung; a long-lived process (a served deployment) forgets the oldest job's sentences, not growing
_SAID: dict[str, set[str]] = {}
_SAID_LOCK = threading.Lock()
SAID_JOBS = 64
log = logging.getLogger(__name__)


#: seconds a trial-rung waits before the job first looks whether any worker can serve it (``_not_taken``)
FIRST_LOOK = 5.0


def pickup_timeout() -> float:
    """Seconds a trial-rung may wait for a worker before the job says which workers the server knows."""
    return seconds_from_env("HYPERBAND_TASK_PICKUP_TIMEOUT", 120.0)


#: in a ``hyperband worker``'s process only: its trainers, kept between trial-rungs (``app.worker``); the task runs it
#: runs now are ``hand_back``'s
_warm: list[factory.Trainers] = []


class _NoCache(CachePolicy):
    """No cache key, as ``NO_CACHE``, but kept by Prefect's task worker: it gives a task of ``NO_CACHE`` its ``DEFAULT``
    policy, whose key (inputs, flow run) served a trial-rung sent again in one flow run from the cache, untrained."""

    def compute_key(self, task_ctx: Any, inputs: Any, flow_parameters: Any, **kwargs: Any) -> None:
        return None


@task(name=TASK_NAME, cache_policy=_NoCache(), log_prints=False)  # persisted: Prefect's task worker says so
def trial_rung(job: dict[str, Any], rung: dict[str, Any], heartbeat_seconds: float) -> dict[str, Any]:
    """Train one trial-rung (resuming its checkpoint) and evaluate it, in a task worker; its result goes to the
    job's storage, ``results/<task run id>.json``."""
    spec, one = work_pool.on_this_machine(job, rung)
    run_id = str(TaskRunContext.get().task_run.id)  # type: ignore[union-attr]
    get_run_logger().info("on %s, process %d", os.uname().nodename, os.getpid())  # in the UI: which worker runs it
    trainers = _warm[0] if _warm else None
    with factory.scope(trainers, close=trainers is None), stopping.bind(stopping.StopToken()) as token, \
            hand_back.running(run_id, token), \
            work_pool.heartbeat(spec, run_id, heartbeat_seconds, token, given_up=hand_back.given_up):
        from prefect_hyperband.flows import runner

        out = runner.here(spec, one)
    with hand_back.ending(run_id) as why:
        if why == hand_back.HANDED_BACK:  # this worker is stopping: the job runs it again; nothing to say here
            return {"host": os.uname().nodename, "pid": os.getpid(), "handed_back": True}
        if why is not None:  # taken for dead while it trained: its rerun's result is the trial-rung's
            raise work_pool.TrialRunGivenUp(f"given up by the job's controller ({why}); its trial-rung ran again")
        spec.store().write_json(f"results/{run_id}.json", work_pool.result_of(out))
    return {"host": os.uname().nodename, "pid": os.getpid()}


def served(root: str | None, **options: Any) -> Any:
    """``trial_rung`` with its parameters in ``root`` (a job's and its workers' ``--storage``; None: Prefect's
    task-scheduling storage) and a task key of that storage: what a job sends, and what a worker started with the
    same ``--storage`` serves; a worker reading other storage is never sent it. Prefect's key of a task is its
    function's name and a hash of its code: the same code under a name that holds the storage's digest."""
    prefect_internals.shared_tls_context()  # the job's and the worker's clients (one a task run) share one TLS context
    settings = {"name": TASK_NAME, "cache_policy": _NoCache(), "log_prints": False, **options}
    return task(_named(root), result_storage=parameter_storage(root), **settings)


def key_of(root: str | None) -> str:
    """The task key of trial-rungs whose parameters travel through ``root`` (``served``)."""
    return task(_named(root), name=TASK_NAME).task_key


def _named(root: str | None) -> Any:
    """``trial_rung``'s function (its code) under a name that holds the digest of ``root``."""
    fn = trial_rung.fn
    named = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    named.__qualname__ = f"{fn.__name__}{worker_slots.STORE_SEP}{worker_slots.storage_digest(root)}"
    named.__module__, named.__doc__, named.__annotations__ = fn.__module__, fn.__doc__, dict(fn.__annotations__)
    return named


def run_on_workers(job: Job, one: TrialRung) -> tuple[TrainResult | None, Evaluation | None, str | None,
                                                      float | None, float | None]:
    """One trial-rung as a background task run: (trained, evaluated, error, started, ended). Raises
    ``work_pool.TrialRunLost`` when its worker is lost; a stop (Ctrl-C, a timeout) cancels it. Prefect's client
    retries a server that does not answer for up to half an hour, silently (the CLI's 10 retries): here a few
    seconds (``API_CLIENT_RETRIES``), then ``_answering`` waits with one line, bounded by ``--service-wait``."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: API_CLIENT_RETRIES}):
        for _ in range(OUTAGE_RESENDS):
            try:
                return _on_workers(job, one)
            except _AfterOutage as lost:  # the outage was said once; its casualties are sent again quietly
                log.info("trial %s at r=%d: %s; sent again", one.trial_id, one.resource, lost)
        return _on_workers(job, one)


class _AfterOutage(work_pool.TrialRunLost):
    """A trial-rung's task run lost to an outage of the Prefect API that the job waited through: still queued when
    the server restarted (its queue is in memory), or failed in its worker, whose client could not reach the API
    either. Sent again by ``run_on_workers`` itself, without a line of its own."""


def _on_workers(job: Job, one: TrialRung) -> tuple[TrainResult | None, Evaluation | None, str | None,
                                                   float | None, float | None]:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Crashed

    future, _ = answering(lambda: _send(job, one))
    run_id, store, name = future.task_run_id, job.store(), f"task run {one.trial_id} to r={one.resource}"
    outage, back, parameters = False, 0.0, None  # the API waited for while it was out; when it last answered
    beats = work_pool.Beats(store, f"heartbeats/{run_id}.json", work_pool.heartbeat_timeout())
    began = looked = time.monotonic()
    claims = storage_at(job.task_storage, job.job_dir) if job.task_storage else None
    holder = worker_watch.Holder(claims, store, run_id, beats.key)  # a worker gone: its trial-rung runs again at once
    with get_client(sync_client=True) as client:
        def end(state: Any) -> None:  # the run given up (its parameters and claim deleted) or stopped
            answering(lambda: client.set_task_run_state(run_id, state, force=True))
            _drop_parameters(job, run_id, parameters)

        while True:
            state, waited = _state(client, run_id, job)
            parameters = parameters or getattr(getattr(state, "state_details", None), "task_parameters_id", None)
            outage, back = outage or waited, time.monotonic() if waited else back
            if stopping.requested():
                end(Cancelled(message="the hyperband job is stopping"))
                return None, None, "Stopped: the job is stopping", None, None
            if state is not None and state.is_final():
                break
            waiting = state is None or state.type.value == "SCHEDULED"
            if waiting and waited:  # the server's queue of task runs is in memory: a restart forgot this one
                end(Cancelled(message="the Prefect API was away: sent again"))
                raise _AfterOutage(f"{name} ({run_id}): still waiting for a worker after the Prefect API was away "
                                   "(a restarted server forgets the task runs it had queued)")
            pending = state is not None and state.type.value == "PENDING"
            if outage and pending and time.monotonic() - back > OUTAGE_PENDING:
                end(Cancelled(message="its worker could not begin it while the Prefect API was away: sent again"))
                raise _AfterOutage(f"{name} ({run_id}): pending since the Prefect API was away (its worker could not "
                                   "begin it without the API)")
            if waiting and time.monotonic() - looked > (FIRST_LOOK if looked == began else pickup_timeout()):
                _not_taken(client, job, one, run_id, time.monotonic() - began, end, holder.worker)
                looked = time.monotonic()  # the server asked again a timeout later, not every poll
            dead = holder.gone() or (None if waiting else beats.dead(state))  # or PENDING too long, RUNNING unbeaten
            if dead:
                end(Crashed(message=dead))
                store.delete(beats.key)
                raise work_pool.TrialRunLost(f"{name} ({run_id}): {dead}")
            if _landed(store, f"results/{run_id}.json", POLL_SECONDS):  # before the server hears the run end
                break
    result = store.read_json(f"results/{run_id}.json")  # the task run's id, as the worker's context gives it
    if result is None:  # handed back, crashed or failed: its parameters and claim go too (the run is sent anew)
        _drop_parameters(job, run_id, parameters)
        lost = _AfterOutage if outage and state.type.value in ("FAILED", "CRASHED") else work_pool.TrialRunLost
        raise lost(f"task run {run_id} ended {state.type.value}: {_why_lost(run_id, state)}")
    store.delete(f"results/{run_id}.json")
    _drop_parameters(job, run_id, parameters)
    return work_pool.outcome_of(result)


def _why_lost(run_id: Any, state: Any) -> str:
    """Why a task run ended without a result: its state's message, or for one handed back (``Crashed``, then ended
    ``Completed`` by Prefect's engine once our function returned: the server allows it), the ``Crashed`` one's."""
    from prefect.client.orchestration import get_client
    if state.type.value == "COMPLETED":
        with contextlib.suppress(Exception), get_client(sync_client=True) as client:
            crashed = [s for s in client.read_task_run_states(run_id) if s.type.value == "CRASHED"]
            if crashed and crashed[-1].message:
                return crashed[-1].message
    return state.message or "no result"


def _not_taken(client: Any, job: Job, one: TrialRung, run_id: Any, waited: float, end: Callable[[Any], None],
               holder: str | None = None) -> None:
    """A trial-rung no worker has begun in ``waited`` seconds. No worker able to serve it (none connected, none of this
    code, none reading the job's storage): said once per job, and it waits for one. Workers serving it, past the
    pickup timeout, none holding it (a live ``holder`` waits for a slot): it was sent to a worker that died before it
    began without a claim (delivery is at most once), sent again."""
    from prefect.states import Cancelled

    why = worker_slots.who_serves(client, key_of(job.task_storage), job.task_storage)
    if why.startswith(worker_slots.SERVED):
        if waited > pickup_timeout() and holder is None:
            end(Cancelled(message="not begun in time: sent again"))
            raise work_pool.TrialRunLost(f"task run {one.trial_id} to r={one.resource} ({run_id}): not begun in "
                                         f"{waited:.0f} s while {why}")
        return
    if _first_time(job.job_id, why):  # the same for its other trial-rungs: once
        log.warning("trial %s at r=%d: no task worker took it in %.0f s; %s", one.trial_id, one.resource, waited, why)


def _send(job: Job, one: TrialRung) -> Any:
    """The trial-rung as a background task run of ``trial_rung`` (its future), its parameters in the job's storage."""
    beat_every = min(work_pool.HEARTBEAT_SECONDS, work_pool.heartbeat_timeout() / 4)
    # named for the trial-rung: Prefect names a task run made in a flow run "<task's name>-<key>" (the name is not
    # the task's key: the workers still take it)
    submitted = served(job.task_storage, name=f"{one.trial_id} to r={one.resource}",
                       tags=["hyperband", f"job:{job.job_id}"])
    return contextvars.copy_context().run(_outside_runs, submitted, job=job.to_json(), rung=asdict(one),
                                          heartbeat_seconds=beat_every)


def _drop_parameters(job: Job, run_id: Any, parameters_id: Any) -> None:
    """The trial-rung's parameters in the job's ``--storage`` deleted once its result is in: they no longer pile up
    there, a file a trial-rung. Their name is in the task run's SCHEDULED state: the job's first look at it, or (a
    worker took it before that look) its states read back. Without ``--storage`` they are in Prefect's own storage,
    left as Prefect leaves them."""
    if not job.task_storage:
        return
    try:
        storage_at(job.task_storage, job.job_dir).delete(worker_watch.claim_key(run_id))  # (``worker_watch``)
        if not parameters_id:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                parameters_id = next((st.state_details.task_parameters_id for st in client.read_task_run_states(run_id)
                                      if st.state_details.task_parameters_id), None)
        if parameters_id:
            storage_at(job.task_storage, job.job_dir).delete(f"task-parameters/parameters/{parameters_id}")
    except Exception as exc:  # noqa: BLE001  (a file left behind costs its bytes, not the trial-rung)
        log.debug("task run %s: its parameters not deleted (%s)", run_id, exc)


def _first_time(job_id: str, sentence: str) -> bool:
    """Whether the job has not said ``sentence`` of its workers yet (it is said now)."""
    with _SAID_LOCK:
        said = _SAID.setdefault(job_id, set())
        first = sentence not in said
        said.add(sentence)
        while len(_SAID) > SAID_JOBS:
            del _SAID[next(iter(_SAID))]
    return first


def _landed(store: Any, key: str, seconds: float) -> bool:
    """Whether the trial-rung's result is in the job's storage, looked for over ``seconds``: in a folder every
    ``RESULT_LOOK`` seconds (a stat: the job hears of the result without the task run's end reaching the server
    and a poll of it, 0.2-0.3 s a trial-rung), on an object store not at all (a request costs what a state read does)."""
    if not store.local:
        time.sleep(seconds)
        return False
    path, ends = store.url(key), time.monotonic() + seconds
    while time.monotonic() < ends:
        if os.path.exists(path):
            return True
        time.sleep(RESULT_LOOK)
    return os.path.exists(path)


def _state(client: Any, run_id: Any, job: Job) -> tuple[Any, bool]:
    """The task run's state, and whether the API was waited for (``api_wait.answering``); ``TrialRunLost`` naming the likely
    cause when a worker deleted the run (Prefect's task worker deletes one whose parameters it cannot read)."""
    from prefect.exceptions import ObjectNotFound

    try:
        run, waited = answering(lambda: client.read_task_run(run_id))
        return run.state, waited
    except ObjectNotFound:
        where = f"--storage {job.task_storage}" if job.task_storage else "the default task-scheduling storage"
        raise work_pool.TrialRunLost(
            f"task run {run_id} was deleted: a task worker could not read its parameters ({where}); start "
            f"`hyperband worker{' --storage ' + job.task_storage if job.task_storage else ''}` where that storage "
            "is reachable") from None


def _outside_runs(submitted: Any, **parameters: Any) -> Any:
    """``submitted.delay(**parameters)`` as a task run of the caller's flow run (the trial-rung's group subflow run,
    where the Prefect UI shows it), with no run in the context Prefect pickles with the parameters (the subflow run's
    hold the scheduler's callbacks: no pickle): ``Task.apply_async``'s steps, the flow run (detached: a key of its
    own) given to ``create_run``. The settings and tags stay (the caller's context is a copy)."""
    from prefect.context import FlowRunContext
    from prefect.futures import PrefectDistributedFuture
    from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

    flow_run = FlowRunContext.get()
    flow_run = flow_run.model_copy(update={"detached": True}) if flow_run is not None else None
    # sent with it, for the worker: its train and evaluate task runs have no flow run there (else a warning a line)
    with temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}):
        run = prefect_internals.detached_task_run(submitted, flow_run, parameters)
    return PrefectDistributedFuture(task_run_id=run.id)
