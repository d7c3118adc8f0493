"""A full disk under the job folder (issue 40, item 3): the job stops in one line naming the path and the space, no
file half-written is read as good, and --resume after space is freed finishes with nothing lost or repeated.

The job folder is a tmpfs of 256 KiB (each file takes at least one 4 KiB page: the checkpoints of a (1, 27, 3)
synthetic job fill it mid-job); MLflow's store is elsewhere. Mounting needs root, as CI and this machine have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
HYPERBAND = str(Path(sys.executable).parent / "hyperband")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_job_folder_stops_the_job_in_one_line_and_resume_finishes_it(small_disk, tmp_path, mlflow_db):
    from prefect.settings import PREFECT_API_URL

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the session's Prefect server (a temporary one per process is not what this test is about: its start costs
    # each of the two jobs about 12 s of CPU)
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": PREFECT_API_URL.value()}
    argv = [HYPERBAND, "tune", "--model", "synthetic", "--max-resource", "27", "--eta", "3", "--concurrency", "2",
            "--job-dir", str(small_disk / "jobs"), "--tracking-uri", uri, "--experiment", "full", "--json"]
    first = subprocess.run([*argv, "--job-id", "full"], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=600)
    assert first.returncode == 75, first.stderr[-3000:]
    assert "Traceback" not in first.stderr + first.stdout, first.stderr[-3000:]
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("hyperband: job full stopped: no space left on device writing "), last
    assert str(small_disk) in last and "MiB free of" in last and "KiB each" in last and "--resume full" in last

    job = small_disk / "jobs" / "full"
    assert not list(job.rglob("*.tmp")), "a half-written file was left"
    json.loads((job / "state.json").read_text())  # the snapshot is whole
    for journal in job.glob("journal.*.jsonl"):  # every record whole: a failed append was cut back
        data = journal.read_bytes()
        assert not data or data.endswith(b"\n"), journal
        [json.loads(line) for line in data.splitlines()]

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)  # space freed
    resumed = subprocess.run([*argv, "--resume", "full"], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])["summary"]
    assert summary["configs"] == 49 and summary["trial_rungs"] == 69 and summary["failed_trials"] == 0, summary
    _, _, children = runs_of(uri, "full", json.loads(resumed.stdout.strip().splitlines()[-1])["parent_run_id"])
    finished = [c for c in children if c.info.status == "FINISHED"]
    assert len(finished) == 49 and len({c.data.tags["hyperband.trial_id"] for c in finished}) == 49
    assert all(c.info.status == "FINISHED" or c.data.tags.get("hyperband.status") == "abandoned" for c in children)
