"""The trial pool's pieces that need no worker: the job as a flow-run parameter, and telling a dead trial
flow run from a slow one (the end-to-end run with real workers is tests/deployments/test_trial_pool.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefect_hyperband.executors.job import Job
from prefect_hyperband.flows import work_pool as trial_flow
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.flows.prepare import prepare


def test_the_job_round_trips_through_json_as_a_flow_run_parameter(tmp_path, tracking_uri):
    import json
    from dataclasses import replace

    job = prepare(TuneParams(model="xgboost", max_resource=9, job_dir=str(tmp_path), data="breast-cancer"))
    job = replace(job, trial_pool="p", storage=f"s3://b/x/{job.job_id}")
    back = Job.from_json(json.loads(json.dumps(job.to_json())))
    assert back == job and hash(back.settings) == hash(job.settings)  # the trainer cache's key
    assert back.storage == f"s3://b/x/{job.job_id}" and back.trial_pool == "p"
    assert back.checkpoint_url("t", 3) == f"s3://b/x/{job.job_id}/checkpoints/t/r3.ubj"
    # a job's JSON from before rounds_per_unit moved into the model's knobs (a flow run an older controller queued)
    older = job.to_json()
    older["settings"] = {**older["settings"], "extra": [], "rounds_per_unit": 3}
    assert dict(Job.from_json(json.loads(json.dumps(older))).settings.extra) == {"rounds_per_unit": 3}


class _Store:
    def __init__(self):
        self.beat = None

    def read_json(self, key):
        return self.beat


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(trial_flow.time, "monotonic", lambda: now[0])
    return now


def _state(name):
    return SimpleNamespace(type=SimpleNamespace(value=name))


def test_a_running_flow_run_whose_heartbeat_stops_is_dead_a_beating_one_is_not(clock):
    store = _Store()
    beats = trial_flow.Beats(store, "k", timeout=8)
    running = _state("RUNNING")
    for n in range(30):  # beating every 2 s for a minute: alive however long it trains
        store.beat = {"beat": n}
        clock[0] += 2
        assert beats.dead(running) is None
    clock[0] += 7
    assert beats.dead(running) is None  # silent for less than the timeout
    clock[0] += 2
    assert "no heartbeat for" in beats.dead(running)


def test_a_run_not_yet_beating_is_given_twice_the_timeout_from_running_for_its_first_beat(clock):
    store = _Store()
    beats = trial_flow.Beats(store, "k", timeout=8)
    running = _state("RUNNING")
    beats.dead(running)
    clock[0] += 15  # a new process on a busy machine: importing, opening the storage
    assert beats.dead(running) is None
    store.beat = {"beat": 1}
    clock[0] += 2
    assert beats.dead(running) is None  # beating now: the plain timeout from here
    clock[0] += 9
    assert "no heartbeat for 9 s" in beats.dead(running)
    late = trial_flow.Beats(_Store(), "k", timeout=8)
    late.dead(running)
    clock[0] += 17
    assert "no heartbeat for 17 s" in late.dead(running)  # never beat: dead after twice the timeout


def test_scheduled_waits_for_a_worker_but_pending_too_long_is_a_worker_gone(clock):
    beats = trial_flow.Beats(_Store(), "k", timeout=8)
    scheduled = _state("SCHEDULED")
    beats.dead(scheduled)
    clock[0] += 3600  # no worker free for an hour: still waiting, not dead
    assert beats.dead(scheduled) is None
    pending = _state("PENDING")
    assert beats.dead(pending) is None
    clock[0] += 15
    assert beats.dead(pending) is None
    clock[0] += 2
    assert "pending for 17 s" in beats.dead(pending)


def test_a_missing_pool_is_one_line(prefect_harness):
    from prefect_hyperband.common.errors import InputError

    with pytest.raises(InputError, match="--trial-pool no-such-pool: no such work pool; create it"):
        trial_flow.ensure_deployment("no-such-pool")


def test_default_concurrency_is_the_pools_limit_or_one_per_online_worker(prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="limited", type="process", concurrency_limit=5), overwrite=True)
        client.create_work_pool(WorkPoolCreate(name="open", type="process"), overwrite=True)
        client.create_work_pool(WorkPoolCreate(name="empty", type="process"), overwrite=True)
        for worker in ("machine-a", "machine-b", "machine-c"):
            client.send_worker_heartbeat("open", worker, heartbeat_interval_seconds=30)
    assert trial_flow.pool_concurrency("limited") == 5
    assert trial_flow.pool_concurrency("open") == 3
    assert trial_flow.pool_concurrency("empty") == 1  # workers may come later: one at a time until then


def test_a_run_its_controller_gave_up_while_it_trained_ends_failed_and_leaves_no_result(prefect_harness, tmp_path,
                                                                                        tracking_uri, monkeypatch):
    """A machine too busy to beat in time: the controller marks the run Crashed and runs the trial-rung again; the
    slow run, when its training ends, must not complete beside that rerun (a CI run counted 7 Completed for 6)."""
    from dataclasses import replace

    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect.states import Crashed

    from prefect_hyperband.flows import runner
    from prefect_hyperband.hyperband.scheduler import TrialRung

    trained = []

    def work(job, trial_rung, trainer):  # what run_remote does on a heartbeat it found too old, while this run trains
        run_id = FlowRunContext.get().flow_run.id
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Crashed(message="no heartbeat for 21 s: its worker or machine is gone"),
                                      force=True)
        trained.append(trial_rung.trial_id)
        return SimpleNamespace(trained=None, evaluated=None, error=None, started=0.0, ended=1.0)

    monkeypatch.setattr(runner, "work", work)
    job = prepare(TuneParams(model="synthetic", max_resource=3, job_dir=str(tmp_path), data="breast-cancer"))
    job = replace(job, trial_pool="p")
    rung = TrialRung(trial_id="s0-0000", bracket=0, rung=0, resource=1, config={"x": 1.0}, checkpoint=None).to_json()
    state = trial_flow.trial(job.to_json(), rung, return_state=True)
    assert trained == ["s0-0000"] and state.type.value == "FAILED"
    assert "given up by the job's controller (no heartbeat for 21 s" in state.message
    assert not list(tmp_path.rglob("results/*.json"))  # nothing for anyone to read as the trial-rung's result


def test_a_run_given_up_while_it_trains_stops_training_at_its_next_beat(prefect_harness, tmp_path, tracking_uri):
    """The real trial flow and synthetic trainer, a training of 60 s: the controller's Crashed mark, set once the run
    beats, stops it at its next heartbeat (0.2 s here), before its unit ends; no checkpoint, no result."""
    import threading
    import time
    from dataclasses import replace

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from prefect_hyperband.hyperband.scheduler import TrialRung

    job = prepare(TuneParams(model="synthetic", max_resource=3, job_dir=str(tmp_path), unit_seconds=60.0))
    job = replace(job, trial_pool="p")
    marked: list[float] = []

    def controller() -> None:  # run_remote on a heartbeat it found too old
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            beats = list(tmp_path.rglob("heartbeats/*.json"))
            if beats:
                with get_client(sync_client=True) as client:
                    client.set_flow_run_state(beats[0].stem, Crashed(message="no heartbeat for 61 s: its worker or "
                                                                              "machine is gone"), force=True)
                marked.append(time.monotonic())
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=controller, daemon=True)
    watcher.start()
    rung = TrialRung(trial_id="s0-0000", bracket=0, rung=0, resource=1, config={"x": 0.5, "y": 0.5},
                     checkpoint=None).to_json()
    state = trial_flow.trial(job.to_json(), rung, heartbeat_seconds=0.2, return_state=True)
    ended = time.monotonic()
    watcher.join(timeout=5)
    assert marked and ended - marked[0] < 20, "the training went on after its run was given up"
    assert state.type.value == "FAILED" and "given up by the job's controller (no heartbeat for 61 s" in state.message
    assert not list(tmp_path.rglob("results/*.json")) and not list(tmp_path.rglob("checkpoints/**/r1*"))
