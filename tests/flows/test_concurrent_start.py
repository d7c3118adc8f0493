"""Two jobs started at the same moment in a new folder (two terminals, a deployment firing twice): a new MLflow
store and a new Prefect home, each job with its own temporary server. Both complete with their own runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_two_jobs_started_together_on_a_new_store_both_complete_with_their_own_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONUNBUFFERED="1", HYPERBAND_NO_LIVE="1")
    argv = [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--max-resource", "9",
            "--no-baseline", "--json"]
    procs = [subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # the same instant: neither store exists yet
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert results[0]["job_id"] != results[1]["job_id"]

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")  # the default store, in the folder they ran in
    runs = client.search_runs([client.get_experiment_by_name("hyperband").experiment_id], max_results=1000)
    parents = {r["parent_run_id"] for r in results}
    assert parents <= {r.info.run_id for r in runs} and len(parents) == 2
    for parent in parents:
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
        assert len(children) == 17 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 17
        assert all(r.info.status == "FINISHED" for r in children)
