"""Production's databases: PostgreSQL under a Prefect server and an MLflow server, and a job against both.

Starts PostgreSQL itself (Debian's ``postgresql`` package: ``initdb`` and ``postgres`` on 127.0.0.1,
a port of its own, trust auth), a Prefect server with ``PREFECT_API_DATABASE_CONNECTION_URL`` on it and
an MLflow server with a PostgreSQL backend store, runs ``hyperband tune`` (1, 9, 3) at concurrency 2
against them, and checks the MLflow shape and that the job never stood still.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from stack import Stack, running, _exe, _free_port, _http, _wait_http, _wait_log, server_env  # noqa: E402  (tests/deployments)

pytestmark = pytest.mark.slow
EXPERIMENT = "pg-hyperband"


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise AssertionError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
    return Path(found[-1]).parent


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the package's ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture
def postgres_stack(request, tmp_path):
    pg_bin, pg_port, prefect_port, mlflow_port = _pg_bin(), _free_port(), _free_port(), _free_port()
    data = Path(tempfile.mkdtemp(prefix="hb-pg-"))  # outside pytest's 0700 tmp tree: the postgres user must reach it
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    env = server_env(tmp_path, f"postgresql+asyncpg://hyperband@127.0.0.1:{pg_port}/prefect", prefect_port)
    try:
        with running(request, tmp_path, env) as s:
            s.pg_port, s.prefect_port, s.mlflow_port = pg_port, prefect_port, mlflow_port
            s.pg_bin, s.pg_data = pg_bin, data
            yield s
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_a_job_against_prefect_and_mlflow_on_postgresql(postgres_stack, tmp_path):
    _scenario(postgres_stack, tmp_path)


def _scenario(s: Stack, tmp_path: Path) -> None:
    s.run("initdb", _as_postgres([str(s.pg_bin / "initdb"), "-D", str(s.pg_data), "-U", "hyperband", "--auth=trust",
                                  "--encoding=UTF8", "--no-instructions"]), cwd=s.pg_data)
    s.start("postgres", _as_postgres([str(s.pg_bin / "postgres"), "-D", str(s.pg_data), "-h", "127.0.0.1",
                                      "-p", str(s.pg_port), "-k", str(s.pg_data)]), cwd=s.pg_data)
    _wait_log(s, "postgres", r"ready to accept connections", 1)
    for db in ("prefect", "mlflow"):
        s.run(f"createdb-{db}", [str(s.pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(s.pg_port), "-U", "hyperband", db])

    s.start("prefect-server", [_exe("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(s.prefect_port)])
    mlflow_url = f"http://127.0.0.1:{s.mlflow_port}"
    s.start("mlflow-server", [
        _exe("mlflow"), "server", "--host", "127.0.0.1", "--port", str(s.mlflow_port), "--workers", "1",
        "--backend-store-uri", f"postgresql://hyperband@127.0.0.1:{s.pg_port}/mlflow",
        "--artifacts-destination", str(tmp_path / "mlartifacts"),
    ])
    _wait_http(f"http://127.0.0.1:{s.prefect_port}/api/health", s, "prefect server")
    _wait_http(f"{mlflow_url}/health", s, "mlflow server")
    # the Prefect server really is on PostgreSQL
    tables = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(s.pg_port), "-U", "hyperband", "-d", "prefect", "-tAc",
                             "select count(*) from information_schema.tables where table_name = 'flow_run'"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert tables == "1"

    out = s.run("tune", [_exe("hyperband"), "tune", "--max-resource", "9", "--eta", "3", "--concurrency", "2",
                         "--rounds-per-unit", "2", "--tracking-uri", mlflow_url, "--experiment", EXPERIMENT,
                         "--job-dir", str(tmp_path / "jobs"), "--job-id", "pg-job", "--json"], timeout=600)
    result = json.loads(out.strip().splitlines()[-1])
    assert "View run" not in out  # MLflow's line per ended run against a tracking server: off the terminal
    summary = result["summary"]
    assert summary["configs"] == 17 and summary["trial_rungs"] == 22 and summary["failed_trials"] == 0
    assert summary["resource_used"] == 69
    # nothing stood still: a stall is tens of seconds with no trial-rung training anywhere
    assert summary["longest_idle_seconds"] < 10, summary

    api = f"{mlflow_url}/api/2.0/mlflow"
    experiment = _http("GET", f"{api}/experiments/get-by-name?experiment_name={EXPERIMENT}")["experiment"]
    runs = _http("POST", f"{api}/runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000})["runs"]

    def tags(run):
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    parents = [r for r in runs if "mlflow.parentRunId" not in tags(r)]
    assert len(parents) == 1 and parents[0]["info"]["status"] == "FINISHED"
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == result["parent_run_id"]]
    assert len(children) == 17 and all(r["info"]["status"] == "FINISHED" for r in children)
    assert {tags(r)["hyperband.status"] for r in children} == {"completed", "stopped"}
    winner = next(r for r in children if tags(r)["hyperband.trial_id"] == result["best"]["trial_id"])
    history = _http("GET", f"{api}/metrics/get-history?run_id={winner['info']['run_id']}&metric_key=val_auc")["metrics"]
    assert sorted(m["step"] for m in history)[-1] == result["best"]["resource"]
    alias = _http("GET", f"{api}/registered-models/alias?name={EXPERIMENT}&alias=champion")["model_version"]
    assert alias["run_id"] == winner["info"]["run_id"]
    # the job's flow run is recorded in the PostgreSQL-backed Prefect server, with its task runs
    flow_runs = _http("POST", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/filter", {"limit": 10})
    assert {fr["state"]["type"] for fr in flow_runs} == {"COMPLETED"}  # the job's and its brackets' subflow runs
    assert len([fr for fr in flow_runs if fr["parent_task_run_id"] is None]) == 1 and len(flow_runs) == 1 + 3
    deadline = time.monotonic() + 60  # task runs arrive as events, recorded by the server's task-run recorder
    while (task_runs := _http("POST", f"http://127.0.0.1:{s.prefect_port}/api/task_runs/count", {})) < 2 * 22:
        assert time.monotonic() < deadline, f"{task_runs} task runs recorded, expected train + evaluate for 22 trial-rungs"
        time.sleep(1)
