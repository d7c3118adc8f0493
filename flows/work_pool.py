"""Trial-rungs on a Prefect work pool: each one a ``hyperband-trial`` flow run, wherever a worker runs it.

``--trial-pool POOL`` makes the job flow the controller (brackets, promotions, MLflow, the state) and
sends each trial-rung to the pool's workers as a flow run of the ``hyperband-trial/POOL`` deployment,
which the job creates or updates itself. The flow run is a subflow of the job's run (linked under it in
the UI); it trains and evaluates as the same ``train`` and ``evaluate`` tasks as a local trial-rung,
reading and writing checkpoints through ``--storage`` (a shared folder or an object store), and leaves
its result there, under ``results/<flow run id>.json``, for the controller to read. MLflow is written
by the controller only: workers need the package, the data and the storage, not the tracking server.

``--concurrency`` caps the trial-rungs in flight across the job (the driver's threads, one flow run
each); a pool's own concurrency limit (``prefect work-pool set-concurrency-limit``) caps what the pool
runs at once, and each worker's ``--limit`` what one machine runs.

A flow run that crashes, is cancelled, or whose heartbeat stops (its worker or machine died: nothing
then tells the Prefect server) is an orchestration failure: the controller marks it ``Crashed`` and the
driver runs the trial-rung again from its last checkpoint (twice at most, then the trial fails). A run
taken for dead that was only slow (a machine too busy to beat in time) sees that mark before it trains, at its
next heartbeat while it trains (its training stops at the next unit, as on a stop, saving no checkpoint for the
units it did not finish: the rerun writes the same paths), and before it leaves its result; it ends ``Failed``
saying so, with no result: one ``Completed`` run per trial-rung. A trainer's own error is the trial's: the flow
run completes and reports it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext

from prefect_hyperband.common.errors import InputError, seconds_from_env
from prefect_hyperband.executors.job import Job
from prefect_hyperband.hyperband.scheduler import TrialRung
from prefect_hyperband.tasks.trials import Evaluation
from prefect_hyperband.trainers import factory, stopping
from prefect_hyperband.trainers.base import TrainResult

FLOW_NAME = "hyperband-trial"
#: seconds between a trial flow run's heartbeats (written to the job's storage)
HEARTBEAT_SECONDS = 5.0


def heartbeat_timeout() -> float:
    """Seconds without a heartbeat after which a running trial flow run is taken for dead (its machine, its worker)."""
    return seconds_from_env("HYPERBAND_HEARTBEAT_TIMEOUT", 60.0)


class TrialRunLost(RuntimeError):
    """The trial-rung's flow run ended without a result (crashed, cancelled, its worker gone): run it again."""

    #: the loop runs it again, whatever its message quotes (a worker's "Connection refused" is not the job's outage)
    run_again = True


class TrialRunGivenUp(RuntimeError):
    """This flow run's controller took it for dead (no heartbeat in time) and ran its trial-rung again: its
    result is not wanted (the flow run ends Failed, saying so, not Completed beside the trial-rung's rerun)."""


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=False)
def trial(job: dict[str, Any], trial_rung: dict[str, Any], heartbeat_seconds: float = HEARTBEAT_SECONDS) -> dict[str, Any]:
    """Train one trial-rung (resuming its checkpoint) and evaluate it; the result goes to the job's storage."""
    spec, trial_rung = on_this_machine(job, trial_rung)
    run_id = str(FlowRunContext.get().flow_run.id)
    _go_on_unless_given_up(run_id)  # given up while it waited for a process: no training at all
    store = spec.store()
    with factory.scope(), stopping.bind(stopping.StopToken()) as token:
        with heartbeat(spec, run_id, heartbeat_seconds, token):  # beating before the trainer's imports
            from prefect_hyperband.flows import runner

            out = runner.here(spec, trial_rung)
        _go_on_unless_given_up(run_id)  # given up while it trained (a machine too busy to beat in time)
        result = result_of(out)
        store.write_json(f"results/{run_id}.json", result)
        return result


def on_this_machine(job: dict[str, Any], trial_rung: dict[str, Any]) -> tuple[Job, TrialRung]:
    """A remote trial-rung's job and trial-rung from their JSON, the job's folder on this machine (with an object
    store, a folder of its own for its copies of the checkpoints)."""
    spec = Job.from_json(job)
    if spec.storage:
        spec = replace(spec, job_dir=os.path.join(tempfile.gettempdir(), "prefect-hyperband", spec.job_id))
    else:
        os.makedirs(spec.job_dir, exist_ok=True)
    return spec, TrialRung(**{**trial_rung, "config": dict(trial_rung["config"])})


def result_of(out: Any) -> dict[str, Any]:
    """A remote trial-rung's outcome as it leaves it in the job's storage (``outcome_of`` reads it back)."""
    return {
        "trained": out.trained.to_json() if out.trained is not None else None,
        "evaluated": {"score": out.evaluated.score, "seconds": out.evaluated.seconds,
                      "metrics": out.evaluated.metrics} if out.evaluated else None,
        "error": out.error, "started": out.started, "ended": out.ended, "host": os.uname().nodename,
        "pid": os.getpid(),
    }


def _given_up(run_id: str) -> str | None:
    """Why the controller marked this flow run ``Crashed`` (``run_remote``), or None while it has not."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(run_id)
    crashed = [s for s in states if s.type.value == "CRASHED"]
    return (crashed[-1].message or "marked Crashed") if crashed else None


def _go_on_unless_given_up(run_id: str) -> None:
    """Raise ``TrialRunGivenUp`` when the controller has given this flow run up."""
    why = _given_up(run_id)
    if why is not None:
        raise TrialRunGivenUp(f"given up by the job's controller ({why}); its trial-rung ran again")


@contextlib.contextmanager
def heartbeat(job: Job, run_id: str, seconds: float, token: stopping.StopToken | None = None,
              given_up: Any = None) -> Iterator[None]:
    """A beat in the storage every ``seconds`` while the trial-rung runs: the controller's sign of life. After
    each beat, whether the controller gave the run up (``given_up(run_id)``, a flow run's by default): if so, the
    training is stopped through ``token``."""
    given_up = given_up or _given_up
    store, key, done = job.store(), f"heartbeats/{run_id}.json", threading.Event()
    worker = f"{socket.gethostname()}-{os.getpid()}"  # a task worker's identifier on the server (``worker_watch``)

    def beat() -> None:
        n = 0
        while True:
            n += 1
            try:
                store.write_json(key, {"beat": n, "pid": os.getpid(), "worker": worker}, indent=None)
            except Exception:  # a storage hiccup: the next beat may pass; the controller allows several misses
                pass
            try:
                why = given_up(run_id) if token is not None and not token.requested() else None
            except Exception:  # Prefect's API did not answer this time: asked again at the next beat
                why = None
            if why is not None:
                token.request(reason=f"given up by the job's controller ({why})")  # type: ignore[union-attr]
            if done.wait(seconds):
                return

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
        store.delete(key)


def deployment_name(pool: str) -> str:
    return f"{FLOW_NAME}/{pool}"


_deployed: set[str] = set()


def _read_pool(pool: str):
    """The work pool and its online workers; a missing pool is one line for the user, not a flow run that waits forever."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            found = client.read_work_pool(pool)
        except ObjectNotFound:
            raise InputError(f"--trial-pool {pool}: no such work pool; create it (prefect work-pool create {pool} "
                             "--type process) and start workers on it (prefect worker start --pool "
                             f"{pool})") from None
        workers = client.read_workers_for_work_pool(pool)
    return found, [w for w in workers if str(getattr(w.status, "value", w.status)).upper() == "ONLINE"]


def pool_concurrency(pool: str) -> int:
    """Trial-rungs at once by default on ``pool``: its concurrency limit when it has one, else one per online
    worker (at least one: workers may start later)."""
    found, online = _read_pool(pool)
    return found.concurrency_limit or max(1, len(online))


def ensure_deployment(pool: str) -> str:
    """Create or update the ``hyperband-trial`` deployment on ``pool`` (once per process); its name.

    The entrypoint is a module path, so a worker needs the package installed and nothing else: no
    checkout, image or code storage.
    """
    if pool in _deployed:
        return deployment_name(pool)
    from prefect.deployments.runner import EntrypointType

    _read_pool(pool)
    deployment = trial.to_deployment(
        name=pool,
        description="One Hyperband trial-rung: train from its checkpoint, evaluate; created by hyperband tune --trial-pool.",
        tags=["hyperband"],
        work_pool_name=pool,
        job_variables={"env": {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}},
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    deployment.apply()
    _deployed.add(pool)
    return deployment_name(pool)


#: seconds between reads of a trial flow run's state
POLL_SECONDS = 0.5


def run_remote(job: Job, trial_rung: TrialRung) -> tuple[TrainResult | None, Evaluation | None, str | None, float | None, float | None]:
    """One trial-rung as a flow run on the job's pool: (trained, evaluated, error, started, ended).

    Raises ``TrialRunLost`` when the flow run leaves no result; a stop (Ctrl-C, a timeout) cancels it."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelled, Cancelling, Crashed

    name = ensure_deployment(job.trial_pool)  # type: ignore[arg-type]
    beat_every = min(HEARTBEAT_SECONDS, heartbeat_timeout() / 4)
    parameters = {"job": job.to_json(), "trial_rung": _trial_json(trial_rung), "heartbeat_seconds": beat_every}
    run = run_deployment(name, parameters=parameters, timeout=0, as_subflow=True,
                         flow_run_name=f"{trial_rung.trial_id} to r={trial_rung.resource}", tags=["hyperband", f"job:{job.job_id}"])
    store, key = job.store(), f"results/{run.id}.json"
    beats = Beats(store, f"heartbeats/{run.id}.json", heartbeat_timeout())
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(run.id).state
            if stopping.requested():  # Ctrl-C or this trial-rung's timeout: its worker kills a started flow run
                started = state is not None and state.type.value not in ("SCHEDULED", "PENDING")
                ending = Cancelling if started else Cancelled  # one no worker has started: cancelled at once
                client.set_flow_run_state(run.id, ending(message="the hyperband job is stopping"), force=True)
                return None, None, "Stopped: the job is stopping", None, None
            if state is not None and state.is_final():
                break
            dead = beats.dead(state)
            if dead:
                client.set_flow_run_state(run.id, Crashed(message=dead), force=True)
                store.delete(beats.key)
                raise TrialRunLost(f"flow run {run.name} ({run.id}): {dead}")
            time.sleep(POLL_SECONDS)
    result = store.read_json(key)
    if result is None:
        raise TrialRunLost(f"flow run {run.name} ({run.id}) ended {state.type.value}: {state.message or 'no result'}")
    store.delete(key)
    return outcome_of(result)


def outcome_of(result: dict[str, Any]) -> tuple[TrainResult | None, Evaluation | None, str | None, float | None,
                                                 float | None]:
    """A trial-rung's result as a remote run leaves it in the storage: (trained, evaluated, error, started, ended)."""
    trained = TrainResult(**result["trained"]) if result["trained"] else None
    if trained is not None and result.get("host"):  # the machine and process that trained it, for MLflow's run
        trained.info["worker"] = f"{result['host']}:{result.get('pid', '?')}"
    raw = result["evaluated"]
    evaluated = Evaluation(**{**raw, "score": tuple(raw["score"]) if isinstance(raw["score"], list) else raw["score"]}) \
        if raw else None
    return trained, evaluated, result["error"], result["started"], result["ended"]


def _trial_json(trial_rung: TrialRung) -> dict[str, Any]:
    return asdict(trial_rung)


class Beats:
    """Whether a trial flow run still lives: its heartbeats must keep changing once it runs.

    Measured on the controller's clock (machines' clocks may differ): a run whose heartbeat has not changed
    for ``timeout`` seconds is dead; one stuck in PENDING (a worker took it, then died) as well. Its first beat
    is given twice that from RUNNING, as PENDING is: before it, a new process on a busy machine imports the
    package and opens the storage (a CI run saw a live run taken for dead 8 s into RUNNING, trained twice)."""

    def __init__(self, store, key: str, timeout: float) -> None:
        self.store, self.key, self.timeout = store, key, timeout
        self.last: Any = None
        self.since = time.monotonic()
        self.checked = 0.0
        self.state_type: Any = None

    def dead(self, state) -> str | None:
        now = time.monotonic()
        kind = getattr(state, "type", None)
        if kind != self.state_type:  # a new state (SCHEDULED -> PENDING -> RUNNING): the clock starts again
            self.state_type, self.since = kind, now
        name = getattr(kind, "value", "")
        if name == "PENDING" and now - self.since > 2 * self.timeout:
            return f"pending for {now - self.since:.0f} s: the worker that took it is gone"
        if name != "RUNNING" or now - self.checked < min(self.timeout / 4, HEARTBEAT_SECONDS):
            return None
        self.checked = now
        try:
            beat = self.store.read_json(self.key)
        except Exception:  # the storage did not answer this time: not a sign of death
            return None
        if beat != self.last:
            self.last, self.since = beat, now
            return None
        if now - self.since > (2 * self.timeout if self.last is None else self.timeout):
            return f"no heartbeat for {now - self.since:.0f} s: its worker or machine is gone"
        return None
