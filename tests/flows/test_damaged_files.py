"""A damaged state file, job record or checkpoint: the resume finishes the job as if nothing had happened, or
ends in one line and exit 2; never a traceback (real processes: a job SIGKILLed mid-run, its files damaged)."""

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
SYNTHETIC = ["--model", "synthetic", "--max-resource", "9", "--unit-seconds", "0.05", "--concurrency", "1", "--no-baseline"]
XGBOOST = ["--model", "xgboost", "--data", "breast-cancer", "--max-resource", "9", "--concurrency", "1", "--no-baseline"]


class Jobs:
    def __init__(self, root: Path) -> None:
        from prefect.settings import PREFECT_API_URL

        self.root, self.jobs = root, root / "jobs"
        self.env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "PYTHONUNBUFFERED": "1",
                    "PREFECT_API_URL": PREFECT_API_URL.value(), "HYPERBAND_NO_LIVE": "1"}

    def start(self, *argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *argv, "--job-dir",
                                 str(self.jobs), "--json"], env=self.env, cwd=self.root, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, *argv: str) -> tuple[int, dict | None, str]:
        proc = self.start(*argv)
        out, err = proc.communicate(timeout=600)
        lines = out.strip().splitlines()
        return proc.returncode, json.loads(lines[-1]) if proc.returncode == 0 else None, err

    def killed(self, job_id: str, *argv: str, after: int = 6) -> int:
        """``job_id`` SIGKILLed once its state holds ``after`` results; the results it holds."""
        proc = self.start(*argv, "--job-id", job_id)
        state, rows = self.jobs / job_id / "state.json", 0
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and rows < after:
            try:
                rows = len(saved_rows(state.parent))
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        rows = len(saved_rows(state.parent))
        assert after <= rows < 22, "the job was not caught mid-run"
        return rows

    def scores(self, job_id: str) -> dict[tuple[str, int], float]:
        rows = json.loads((self.jobs / job_id / "state.json").read_text())["rows"]
        return {(r["trial_id"], r["resource"]): r["score"] for r in rows}

    def children(self, parent_run_id: str) -> list:
        from mlflow import MlflowClient

        client = MlflowClient(self.env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
        return [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run_id]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Jobs:
    return Jobs(tmp_path_factory.mktemp("damaged"))


@pytest.fixture(scope="module")
def synthetic_whole(jobs) -> dict:
    code, result, err = jobs.run(*SYNTHETIC, "--job-id", "whole")
    assert code == 0, err[-3000:]
    return result


def test_a_truncated_state_resumes_from_its_previous_version_with_the_uninterrupted_result(jobs, synthetic_whole):
    jobs.killed("state", *SYNTHETIC)
    truncate(jobs.jobs / "state" / "state.json")
    code, result, err = jobs.run("--resume", "state")
    assert code == 0, err[-3000:]
    no_traceback(err)
    assert sum("state.json is damaged (JSONDecodeError" in line for line in err.splitlines()) == 1
    assert (result["best"]["trial_id"], result["best"]["score"]) == (synthetic_whole["best"]["trial_id"],
                                                                      synthetic_whole["best"]["score"])
    assert jobs.scores("state") == jobs.scores("whole")
    children = jobs.children(result["parent_run_id"])
    assert len(children) == 17 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 17


def test_a_truncated_job_record_resumes_from_its_previous_version(jobs, synthetic_whole):
    jobs.killed("record", *SYNTHETIC)
    truncate(jobs.jobs / "record" / "job.json")
    code, result, err = jobs.run("--resume", "record")
    assert code == 0, err[-3000:]
    no_traceback(err)
    assert sum("job.json is damaged" in line for line in err.splitlines()) == 1
    assert jobs.scores("record") == jobs.scores("whole")


@pytest.mark.parametrize("name", ["state.json", "job.json"])
def test_nothing_good_left_is_one_line_and_exit_2(jobs, name):
    job_id = f"gone-{name.split('.')[0]}"
    jobs.killed(job_id, *SYNTHETIC)
    for path in (jobs.jobs / job_id / name, jobs.jobs / job_id / f"{name}.prev"):
        truncate(path)
    code, _, err = jobs.run("--resume", job_id)
    assert code == 2, err[-3000:]
    no_traceback(err)
    errors = [line for line in err.splitlines() if line.startswith("hyperband: error: ")]
    assert len(errors) == 1 and f"{job_id}/{name} is damaged" in errors[0] and "previous version" in errors[0]


def test_zero_byte_checkpoints_are_trained_again_and_the_job_ends_as_if_untouched(jobs):
    """XGBoost: every checkpoint at r=1 and r=3 emptied mid-job; the promoted trials rebuild theirs rung by rung
    with the calls that first wrote them, so every later score is bit-for-bit the uninterrupted job's."""
    code, whole, err = jobs.run(*XGBOOST, "--job-id", "xgb-whole")
    assert code == 0, err[-3000:]
    jobs.killed("xgb", *XGBOOST, after=4)
    emptied = [p for p in (jobs.jobs / "xgb" / "checkpoints").glob("*/r[13].ubj")]
    assert emptied
    for path in emptied:
        path.write_bytes(b"")
    code, result, err = jobs.run("--resume", "xgb")
    assert code == 0, err[-3000:]
    no_traceback(err)
    assert "is empty (0 bytes); trained it again" in err
    assert jobs.scores("xgb") == jobs.scores("xgb-whole")
    assert (result["best"]["trial_id"], result["best"]["score"]) == (whole["best"]["trial_id"], whole["best"]["score"])
    assert result["summary"]["resource_used"] > whole["summary"]["resource_used"]  # the rebuilt units are counted
