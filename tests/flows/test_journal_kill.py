"""A job SIGKILLed while it appends to its journal resumes with no result lost or repeated (real processes). On a
local folder, ``test_modes``' kill test does this for Hyperband, ASHA and TPE (and ``test_damaged_files`` with a
damaged snapshot); here, on an object store (moto's S3 on loopback), where the journal goes up in segments.
All four (ASHA and Hyperband, folder and S3) passed when this test was written; the parameters take them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_hyperband.executors.state import saved_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
COMMON = ["--model", "synthetic", "--max-resource", "9", "--no-baseline", "--seed", "4", "--json"]


def start(root: Path, *argv: str) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "PYTHONUNBUFFERED": "1",
           "PREFECT_API_URL": PREFECT_API_URL.value(), "HYPERBAND_NO_LIVE": "1"}
    return subprocess.Popen([sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *argv,
                             "--job-dir", str(root / "jobs")], env=env, cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def children(root: Path, parent_run_id: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=5000)
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run_id]


@pytest.mark.parametrize("where", ["s3"])
@pytest.mark.parametrize("mode", ["hyperband"])
def test_a_job_killed_mid_append_resumes_with_no_result_lost_or_repeated(where, mode, tmp_path, request):
    # ASHA at one slot: its promotions do not depend on timing, so the resumed job must be the uninterrupted one
    search = ["--mode", "asha", "--max-trials", "40", "--concurrency", "1"] if mode == "asha" else ["--concurrency", "2"]
    storage: list[str] = []
    # on S3 the journal goes up once a second: units long enough that the kill comes between two of its segments
    # (and, as test_modes' kill test, units longer than an MLflow write: ASHA's next decision then sees every result)
    search += ["--unit-seconds", "0.2" if where == "s3" else "0.05"]
    if where == "s3":
        request.getfixturevalue("s3")  # moto on loopback; its endpoint is in the environment the jobs inherit
        storage = ["--storage", f"s3://bucket/kill-{mode}"]
    whole = finish(start(tmp_path, *COMMON, *search, *storage, "--job-id", "whole"))

    proc = start(tmp_path, *COMMON, *search, *storage, "--job-id", "cut")
    state = f"s3://bucket/kill-{mode}/cut" if storage else tmp_path / "jobs" / "cut"
    deadline, saved = time.time() + 300, 0
    while time.time() < deadline and proc.poll() is None and saved < 10:
        try:
            saved = len(saved_rows(state))
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    kept = saved_rows(state)
    assert 10 <= len(kept) < whole["summary"]["trial_rungs"], "the job was not caught mid-run"

    resumed = finish(start(tmp_path, "--resume", "cut", *storage, "--json"))
    summary = resumed["summary"]
    assert summary["trial_rungs"] == whole["summary"]["trial_rungs"]  # nothing trained twice, nothing lost
    assert summary["resource_used"] == whole["summary"]["resource_used"]
    assert (resumed["best"]["trial_id"], resumed["best"]["score"]) == (whole["best"]["trial_id"], whole["best"]["score"])
    rows = saved_rows(state)
    assert len({(r["trial_id"], r["resource"]) for r in rows}) == len(rows) == summary["trial_rungs"]
    assert {(r["trial_id"], r["resource"]): r["score"] for r in rows} == \
        {(r["trial_id"], r["resource"]): r["score"] for r in saved_rows(
            f"s3://bucket/kill-{mode}/whole" if storage else tmp_path / "jobs" / "whole")}
    runs = children(tmp_path, resumed["parent_run_id"])
    assert len(runs) == summary["configs"] == len({r.data.tags["hyperband.trial_id"] for r in runs})
    assert all(r.info.status == "FINISHED" for r in runs)
