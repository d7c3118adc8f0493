"""A Dask worker SIGKILLed mid-job (with its nanny: a machine lost) costs the trial-rung it held a retry, not the
job: issue 87. A real scheduler and workers on loopback; the job runs untouched, then again with a worker killed
once the job has ended a given number of trial-rungs (while it runs a rank: mid-training), a replacement worker
started a little later. The killed job ends, every trial FINISHED, the same scores as the untouched one, its wall
bounded by the untouched one's plus the lost work."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from dask_cluster import Cluster, cluster  # tests/dask_cluster.py
from mlflow_runs import runs_of  # tests/flows

from prefect_hyperband.executors import dask_groups
from prefect_hyperband.executors.state import saved_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

#: seconds the killed job may take beyond the untouched one's wall and its lost work (detection, the replacement
#: worker's start, a group's data scattered again, a loaded 2-core machine's noise)
SLACK = 45.0


def rows_of(result: dict) -> list[dict]:
    return json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]


def kill_mid_training(c: Cluster, jobs: Path, ended: int, replace_on: str, killed: list[str],
                      replace_after: float = 3.0) -> None:
    """Once the job has saved ``ended`` results, SIGKILL a worker (and its nanny) while it runs a task, else (none
    caught busy within 10 s) any worker; ``replace_after`` seconds later start a new worker on ``replace_on``."""
    from distributed import Client

    with Client(c.address, timeout="10s") as client:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            states = list(jobs.glob("*/state.json"))
            if states and len(saved_rows(states[0].parent)) >= ended:
                break
            time.sleep(0.1)
        else:
            return
        looking = time.monotonic() + 10
        while True:
            # busy by the worker's own state (a task in its threads), not the scheduler's processing list,
            # which still holds a task whose result the worker has sent: killing it then loses nothing
            busy = [w for w, n in client.run(dask_groups.executing).items() if n]
            if busy or time.monotonic() > looking:
                victim = busy[0] if busy else sorted(client.scheduler_info()["workers"])[-1]
                pid = client.run(os.getpid, workers=[victim])[victim]
                c.kill(pid)
                killed.append(victim + (" (busy)" if busy else " (idle)"))
                break
            time.sleep(0.02)
    time.sleep(replace_after)
    c.add(replace_on)


def run_twice(tracking_uri: str, tmp_path: Path, hosts: list[str], ended: int, **params) -> tuple[dict, dict, list]:
    """The job untouched, then with a worker killed after ``ended`` results (a replacement started after it)."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    common = dict(eta=3, seed=0, baseline=False, register_model=False, **params)
    with cluster(hosts, str(tmp_path)) as c:
        began = time.monotonic()
        untouched = tune(TuneParams(**common, dask_address=c.address, job_dir=str(tmp_path / "a"), job_id="untouched",
                                    experiment="untouched"))
        untouched["wall"] = time.monotonic() - began
        killed: list[str] = []
        killer = threading.Thread(target=kill_mid_training,
                                  args=(c, tmp_path / "b", ended, hosts[-1], killed), daemon=True)
        killer.start()
        began = time.monotonic()
        lost = tune(TuneParams(**common, dask_address=c.address, job_dir=str(tmp_path / "b"), job_id="killed",
                               experiment="killed"))
        lost["wall"] = time.monotonic() - began
        killer.join(30)
    print(f"untouched {untouched['wall']:.1f} s; killed {killed}: {lost['wall']:.1f} s, "
          f"{lost['summary']['lost_worker_seconds']:.1f} worker-s lost")
    if lost["summary"]["failed_trials"]:  # shown with a failure: what the scheduler saw
        print("scheduler's log:", *(tmp_path / "scheduler.log").read_text().splitlines()[-40:], sep="\n")
    return untouched, lost, killed


def check(tracking_uri: str, untouched: dict, lost: dict, killed: list, workers: int) -> None:
    assert killed, "no worker was killed: the job ended first"
    scores = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(lost)}
    expected = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(untouched)}
    assert scores == expected  # the same trial-rungs, the same scores: a retried segment trains the same model
    best, expected_best = lost["best"], untouched["best"]
    assert best["trial_id"] == expected_best["trial_id"] and best["score"] == expected_best["score"]
    assert lost["summary"]["failed_trials"] == 0
    _, _, children = runs_of(tracking_uri, "killed", lost["parent_run_id"])
    assert len(children) == lost["summary"]["configs"] == untouched["summary"]["configs"]
    assert all(r.info.status == "FINISHED" for r in children)
    if killed[0].endswith("(busy)"):  # its training ran again on another group: the lost time is on record
        assert lost["summary"]["lost_worker_seconds"] > 0
    bound = untouched["wall"] + lost["summary"]["lost_worker_seconds"] / workers + SLACK
    assert lost["wall"] <= bound, (lost["wall"], bound)


def test_xgboost_on_one_worker_groups_survives_a_killed_worker_and_a_replacement_joins(tracking_uri, tmp_path):
    untouched, lost, killed = run_twice(tracking_uri, tmp_path, ["127.0.0.1", "127.0.0.2"], ended=6,
                                        model="xgboost", data="breast-cancer", max_resource=9, workers=1)
    check(tracking_uri, untouched, lost, killed, 1)


def test_xgboost_on_two_worker_groups_survives_a_killed_worker_its_peer_regrouping(tracking_uri, tmp_path):
    untouched, lost, killed = run_twice(tracking_uri, tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"], ended=6,
                                        model="xgboost", data="breast-cancer", max_resource=9, workers=2)
    check(tracking_uri, untouched, lost, killed, 2)
