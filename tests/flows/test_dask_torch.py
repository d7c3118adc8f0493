"""The torch job on a Dask cluster of two "hosts": each trial-rung's two DDP ranks on a group of two Dask workers,
two trial-rungs at once, a worker SIGKILLed mid-trial-rung, and the numbers of the same job on one machine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from dask_cluster import cluster  # tests/dask_cluster.py
from mlflow_runs import runs_of  # tests/flows

from prefect_hyperband.executors.state import saved_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"]  # two groups of two, each across two hosts


def rows_of(result: dict) -> list[dict]:
    return json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]


def kill_a_busy_worker(address: str, jobs: Path, killed: list[str]) -> None:
    """Once the job has 4 results, SIGKILL a worker that runs a rank (Dask's nanny restarts it, new address)."""
    from distributed import Client

    with Client(address, timeout="10s") as client:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            states = list(jobs.glob("*/state.json"))
            if states and len(saved_rows(states[0].parent)) >= 4:
                busy = [w for w, keys in client.processing().items() if keys]
                if busy:
                    pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(busy[0])
                    return
            time.sleep(0.2)


def test_the_torch_job_on_dask_groups_survives_a_killed_worker_and_equals_the_job_on_one_machine(
        tracking_uri, tmp_path, capsys):
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    common = dict(model="torch", data="digits", min_resource=1, max_resource=9, eta=3, workers=2, seed=0,
                  baseline=False, register_model=False, job_dir=str(tmp_path / "jobs"))
    with cluster(HOSTS, str(tmp_path)) as c:
        from prefect_hyperband.app.cli import main

        assert main(["tune", "--model", "torch", "--data", "digits", "--workers", "5", "--dask-address", c.address,
                     "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", tracking_uri]) == 2  # before any training
        assert capsys.readouterr().err.strip().endswith("has 4 workers, fewer than --workers 5")
        killed: list[str] = []
        killer = threading.Thread(target=kill_a_busy_worker, args=(c.address, tmp_path / "jobs", killed))
        killer.start()
        state = tune(TuneParams(**common, dask_address=c.address, job_id="dask", experiment="dask"), return_state=True)
        remote = state.result()
        killer.join()
    local = tune(TuneParams(**common, job_id="local"))
    assert remote["summary"]["concurrency"] == 2 and local["summary"]["concurrency"] == 1
    scores = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(remote)}
    expected = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(local)}
    # on a failure, what differs: the promotions (keys on one side only) follow from a score that differed below
    assert scores.keys() == expected.keys() and len(scores) == 22, differences(scores, expected)
    assert all(abs(scores[k] - expected[k]) <= 1e-6 for k in scores), differences(scores, expected)
    intervals = sorted((r["started"], r["ended"]) for r in rows_of(remote))
    assert sum(1 for (a0, a1), (b0, b1) in zip(intervals, intervals[1:]) if b0 < a1) >= 3  # both groups at once
    assert all(r["workers"] == 2 for r in rows_of(remote))
    # the killed worker's trial-rung ran again on another group: its time is lost worker-seconds, no run twice
    assert killed and remote["summary"]["lost_worker_seconds"] > 0 and remote["summary"]["failed_trials"] == 0
    _, _, children = runs_of(tracking_uri, "dask", remote["parent_run_id"])
    assert len(children) == remote["summary"]["configs"] and all(r.info.status == "FINISHED" for r in children)
    # in Prefect, each trial-rung's train and evaluate task runs are tagged with its group's worker addresses
    placed = task_run_tags(state.state_details.flow_run_id, 2 * 22)
    assert len(placed) == 2 * 22 and all(len(t) == 2 and all(a.startswith("tcp://127.0.0.") for a in t) for t in placed)
    assert len(set(placed)) >= 2 and any(len({a.rsplit(":", 1)[0] for a in t}) == 2 for t in placed)  # across hosts


def differences(scores: dict, expected: dict) -> dict:
    """The trial-rungs on one side only, and the scores that differ, Dask's against one machine's."""
    both = scores.keys() & expected.keys()
    return {"dask only": sorted(scores.keys() - both), "one machine only": sorted(expected.keys() - both),
            "differ": {k: (scores[k], expected[k]) for k in sorted(both) if abs(scores[k] - expected[k]) > 1e-6}}


def task_run_tags(flow_run_id, n: int, wait: float = 150) -> list[tuple[str, ...]]:
    """The tags of the flow run's train and evaluate task runs (in its ``hyperband-group`` subflow runs), once the
    server has recorded ``n`` of them (it records them from their events, within seconds; a busy SQLite can delay
    that: see test_modes)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    deadline = time.monotonic() + wait
    with get_client(sync_client=True) as client:
        groups = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
        only = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id, *(g.id for g in groups)]))
        while True:
            runs = [t for t in client.read_task_runs(flow_run_filter=only, limit=200)
                    if t.name.split(" ")[0] in ("train", "evaluate")]
            if len(runs) >= n or time.monotonic() > deadline:
                return [tuple(sorted(t.tags)) for t in runs]
            time.sleep(0.5)
