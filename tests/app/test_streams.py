"""The terminal of a ``hyperband tune`` job: only what the job means to say reaches it (issue 78)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: a process that claims the terminal as a job does, then writes as libraries and child processes do
CLAIMING = textwrap.dedent("""
    import logging, os, subprocess, sys
    from prefect_hyperband.app.streams import job_terminal

    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("demo").addHandler(handler)
    with job_terminal(sys.argv[1]) as out:
        print("a library's print")                                       # Python's stdout
        os.write(1, b"native stdout\\n"); os.write(2, b"native stderr\\n")  # XGBoost's C++ side
        subprocess.run([sys.executable, "-c", "import sys; print('child out'); print('child err', file=sys.stderr)"])
        logging.getLogger("demo").warning("the job's warning")             # a console handler: the terminal's
        print("the job's line", file=sys.stderr)
        print('{"one": "document"}', file=out)
    print("after the job")
""")


def test_every_write_but_the_jobs_own_goes_to_the_log_and_the_terminal_is_given_back(tmp_path: Path):
    log = tmp_path / "job.log"
    done = subprocess.run([sys.executable, "-c", CLAIMING, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"one": "document"}\nafter the job\n'
    assert done.stderr == "the job's warning\nthe job's line\n"
    assert sorted(log.read_text().splitlines()) == sorted(
        ["a library's print", "native stdout", "native stderr", "child out", "child err"])


def test_a_captured_stdout_is_left_as_it_is(tmp_path: Path, capsys):
    from prefect_hyperband.app.streams import job_terminal

    with job_terminal(str(tmp_path / "job.log")) as out:
        print("to the capture", file=out)
    assert capsys.readouterr().out == "to the capture\n"


SCRIPT = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    import prefect_hyperband as hb

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(int(os.environ["HYPERBAND_START"]) + 1, int(os.environ["HYPERBAND_RESOURCE"]) + 1):
        print(f"rank {rank} chatter at step {step}", flush=True)
        print(f"rank {rank} stderr chatter", file=sys.stderr, flush=True)
        hb.report(step, loss=1.0 / step)
    open(os.path.join(os.environ["HYPERBAND_CHECKPOINT_DIR"], "done"), "w").write("1")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush(); os._exit(0)
""")


def _tune(root: Path, *argv: str) -> tuple[subprocess.CompletedProcess, Path]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "HYPERBAND_NO_LIVE": "1",
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    jobs = root / "jobs"
    done = subprocess.run([sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *argv, "--min-resource", "1",
                           "--max-resource", "3", "--eta", "3", "--seed", "1", "--no-baseline", "--job-dir", str(jobs)],
                          env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = list(jobs.glob("*/job.log"))
    assert len(logs) == 1
    return done, logs[0]


@pytest.mark.slow  # four jobs in processes of their own: a local Dask cluster, torch's ranks, a script's launcher
@pytest.mark.usefixtures("prefect_harness")
def test_json_is_one_document_and_no_line_of_the_jobs_processes_reaches_the_terminal(tmp_path: Path):
    import numpy as np
    import pandas as pd

    table = tmp_path / "table"
    table.mkdir()
    rng = np.random.default_rng(0)
    for part in range(2):
        X = rng.normal(size=(2000, 4))
        frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(4)])
        frame["label"] = (X[:, 0] + rng.normal(size=2000) > 0).astype(int)
        frame.to_parquet(table / f"part-{part}.parquet")
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "space.yaml").write_text("lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    jobs = {
        "xgboost on Dask": ["--data", str(table), "--target", "label", "--workers", "2"],
        "torch ranks": ["--model", "torch", "--data", "digits", "--workers", "2"],
        "script": ["--script", str(tmp_path / "script.py"), "--workers", "2", "--space", str(tmp_path / "space.yaml"),
                   "--metric", "loss", "--direction", "minimize"],
    }
    for name, argv in jobs.items():
        root = tmp_path / name.replace(" ", "-")
        root.mkdir()
        done, log = _tune(root, *argv, "--json")
        result = json.loads(done.stdout)  # the whole of stdout: one document, nothing before or after it
        assert result["summary"]["failed_trials"] == 0, name
        for said in (done.stdout, done.stderr):
            assert "got rank" not in said and "chatter" not in said, (name, said[-2000:])
        if name == "xgboost on Dask":
            assert "got rank" in log.read_text()  # XGBoost's collective: the job's log keeps it
    root = tmp_path / "summary"
    root.mkdir()
    done, log = _tune(root, *jobs["xgboost on Dask"])  # without --json: the summary, and no tracker line
    assert done.stdout.startswith(" ") or "baseline" in done.stdout.splitlines()[0]
    assert "got rank" not in done.stdout + done.stderr and "got rank" in log.read_text()
