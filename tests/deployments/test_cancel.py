"""A job run through a deployment and cancelled from Prefect (as the UI's Cancel does): it stops as on SIGTERM.

A Prefect server, a process work pool and worker, the bundled user-code deployment run with a slow
synthetic job; `prefect flow-run cancel` mid-job. The worker sends the flow run's process SIGTERM; the
job stops within seconds, its flow run ends Cancelled, no MLflow run is left RUNNING, and --resume
finishes it with every config's child run once.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from stack import Stack, running, _exe, _free_port, _http, _wait_http, server_env  # noqa: E402  (tests/deployments)
from prefect_hyperband.flows.state import saved_rows

pytestmark = pytest.mark.slow
POOL = "hyperband-cancel"
DEPLOYMENT = "hyperband-tune/sklearn-digits-example"


@pytest.fixture
def stack(request, tmp_path):
    port = _free_port()
    env = server_env(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", port,
                     PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false", PREFECT_CLI_PROMPT="false",
                     PREFECT_WORKER_QUERY_SECONDS="2")
    with running(request, tmp_path, env) as s:
        s.prefect_url = f"http://127.0.0.1:{port}"
        yield s


def _state(stack: Stack, flow_run_id: str) -> dict:
    return _http("GET", f"{stack.prefect_url}/api/flow_runs/{flow_run_id}").get("state") or {}


def test_a_cancelled_deployment_run_stops_cleanly_and_resumes(stack, tmp_path: Path):
    from mlflow import MlflowClient

    stack.start("prefect-server", [_exe("prefect"), "server", "start", "--host", "127.0.0.1",
                                   "--port", stack.prefect_url.rsplit(":", 1)[1]])
    _wait_http(f"{stack.prefect_url}/api/health", stack, "prefect server")
    stack.run("work-pool-create", [_exe("prefect"), "work-pool", "create", POOL, "--type", "process"])
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    stack.run("hyperband-deploy", [_exe("hyperband"), "deploy", "--pool", POOL, "--name", "sklearn-digits-example",
                                   "--working-dir", str(runs_dir), "--no-schedule"], cwd=tmp_path)
    stack.start("prefect-worker", [_exe("prefect"), "worker", "start", "--pool", POOL, "--limit", "1"], cwd=tmp_path)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    jobs = tmp_path / "jobs"
    params = {"model": "synthetic", "max_resource": 9, "eta": 3, "unit_seconds": 0.4, "concurrency": 2, "seed": 2,
              "baseline": False, "tracking_uri": uri, "job_dir": str(jobs), "job_id": "cancel-me"}
    out = stack.run("deployment-run", [_exe("prefect"), "deployment", "run", DEPLOYMENT, "--params",
                                       json.dumps({"params": params})])
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    state_file = jobs / "cancel-me" / "state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (state_file.exists() and len(saved_rows(state_file.parent)) >= 4):
        stack.check_alive()
        time.sleep(0.2)
    assert state_file.exists(), _state(stack, flow_run_id)
    cancelled = time.monotonic()
    stack.run("cancel", [_exe("prefect"), "flow-run", "cancel", flow_run_id])
    while time.monotonic() - cancelled < 120 and _state(stack, flow_run_id).get("type") not in ("CANCELLED", "COMPLETED",
                                                                                                  "FAILED", "CRASHED"):
        time.sleep(0.5)
    final = _state(stack, flow_run_id)
    took = time.monotonic() - cancelled
    print(f"cancelled in {took:.1f} s: {final.get('type')} {final.get('message')}", file=sys.stderr)
    assert final.get("type") == "CANCELLED", final
    recorded = len(saved_rows(state_file.parent))
    assert recorded < 22  # stopped mid-job
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]

    resumed = stack.run("resume", [_exe("hyperband"), "tune", "--resume", "cancel-me", "--job-dir", str(jobs), "--json"],
                        cwd=tmp_path, timeout=300)
    result = json.loads(resumed.strip().splitlines()[-1])
    assert result["summary"]["trial_rungs"] == 22 and result["summary"]["resource_used"] == 69
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == result["parent_run_id"]]
    assert len(children) == 17 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 17
    assert all(r.info.status == "FINISHED" for r in children)
