"""A training that hangs is failed by the trial-rung timeout; the job finishes and exits; nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from prefect_hyperband.executors.loop import Timeouts as _Timeouts
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.base import TrainResult

HUNG_FUNCTION = """
    import time

    def train(trial):
        if trial.config["x"] > 0.8:
            time.sleep(600)  # hangs, never reports: only the timeout ends it
        return {"loss": trial.config["x"] / trial.resource}
"""
HUNG_SCRIPT = """
    import argparse, os, time
    import prefect_hyperband as hb

    p = argparse.ArgumentParser(); p.add_argument("--x", type=float); x = p.parse_args().x
    if x > 0.8:
        time.sleep(600)
    hb.report(int(os.environ["HYPERBAND_RESOURCE"]), loss=x)
"""
# Well above a healthy trial-rung's time even when this test shares 2 cores with the suite's heaviest tests
# (a script trial-rung starts a Python process: CI saw one pass 5 s, and, while one worker still went through
# torch's launcher, two healthy ones pass 15 s).
TIMEOUT = 15


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("kind", ["trainer", "script"])
def test_a_hung_training_fails_its_trial_on_the_timeout_and_the_job_exits(kind, tmp_path, mlflow_db):
    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL

    code = tmp_path / "hung.py"
    code.write_text(textwrap.dedent(HUNG_FUNCTION if kind == "trainer" else HUNG_SCRIPT))
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PREFECT_API_URL": PREFECT_API_URL.value()}
    target = [f"--{kind}", f"{code}:train" if kind == "trainer" else str(code)]
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *target, "--space", str(space), "--metric", "loss",
         "--direction", "minimize", "--max-resource", "3", "--eta", "3", "--seed", "4", "--concurrency", "2",
         "--trial-timeout", str(TIMEOUT), "--job-dir", str(tmp_path / "jobs"), "--json"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    family: set[int] = set()
    while proc.poll() is None and time.monotonic() - began < 240:
        try:
            family |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.5)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - began
    assert proc.returncode == 0, err[-3000:]
    assert took < 120, f"{took:.0f} s: the job waited for the hung training"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["summary"]["failed_trials"] == 2 and result["summary"]["configs"] == 5  # x = 0.98 and 0.94 hang
    assert result["best"]["config"]["x"] <= 0.8
    assert result["summary"]["lost_worker_seconds"] >= 2 * TIMEOUT  # the two given-up trainings count as cost
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    failed = [r for r in runs if r.data.tags.get("hyperband.status") == "failed"]
    assert len(failed) == 2 and all(r.info.status == "FAILED" for r in failed)
    errors = [r.data.tags["hyperband.error"] for r in failed]
    assert all(f"took more than {TIMEOUT} s" in e or "timed out" in e for e in errors), errors
    time.sleep(0.5)
    left = [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, [psutil.Process(p).cmdline() for p in left]


def test_the_default_timeout_follows_the_measured_pace():
    limits = _Timeouts(None)
    job = TrialRung("s0-0000", 0, 0, 9, {}, None)
    assert limits.limit(job) == _Timeouts.FIRST  # nothing measured yet
    for seconds in (1.0, 2.0, 3.0):
        limits.observe(TrainResult("c", 3, 3, seconds * 3, 1))
    assert limits.limit(job) == max(_Timeouts.FLOOR, 20 * 2.0 * 9)  # 90th percentile of 1, 2, 3 s/unit (index 1)
    assert limits.limit(TrialRung("s0-0000", 0, 0, 81, {}, None)) == 20 * 2.0 * 81
    assert _Timeouts(7.5).limit(job) == 7.5
