"""End to end, as an operator runs it: real Prefect, MLflow and Dask servers on loopback ports,
the project's prefect.yaml deployed to a process work pool (then one deployment replaced by
``hyperband deploy``, as from an installed package), a worker, one run triggered through
the API, and the results checked through MLflow's REST API. Then, on the same server, pool and worker, the
bundled user-code deployment runs a slow synthetic job that is cancelled from Prefect (as the UI's Cancel does):
the worker sends the flow run's process SIGTERM, the job stops within seconds, its flow run ends Cancelled, no
MLflow run is left RUNNING, and ``--resume`` finishes it with every config's child run once.

Everything runs in its own process group under a temporary directory and is torn down at the end;
on failure the tail of every server and worker log is printed.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from prefect_hyperband.executors.state import saved_rows

ROOT = Path(__file__).resolve().parents[2]
POOL = "hyperband-process"
DEPLOYMENT = "hyperband-tune/xgboost-bank-marketing"
EXPERIMENT = "e2e-hyperband"
RUN_TIMEOUT = 360

pytestmark = pytest.mark.slow


from stack import Stack, _exe, _free_port, _http, _wait_http, _wait_log, running, server_env  # noqa: E402  (tests/deployments)


@pytest.fixture
def stack(request, tmp_path):
    prefect_port, mlflow_port, dask_port = _free_port(), _free_port(), _free_port()
    env = server_env(
        tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", prefect_port,
        PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false",  # no nightly runs from the example cron schedule
        PREFECT_CLI_PROMPT="false",
        PREFECT_WORKER_QUERY_SECONDS="2",
    )
    with running(request, tmp_path, env) as s:
        s.prefect_url = f"http://127.0.0.1:{prefect_port}"
        s.mlflow_url = f"http://127.0.0.1:{mlflow_port}"
        s.dask_address = f"tcp://127.0.0.1:{dask_port}"
        yield s


def test_deploy_and_run_through_a_process_worker_then_a_cancelled_run_resumes(stack, tmp_path):
    began = time.monotonic()
    timings: dict[str, float] = {}
    try:
        _scenario(stack, tmp_path, timings)
    finally:
        timings["total"] = time.monotonic() - began
        print("e2e timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), file=sys.stderr)


def _scenario(stack: Stack, tmp_path: Path, timings: dict[str, float]) -> None:
    t0 = time.monotonic()
    prefect_port = stack.prefect_url.rsplit(":", 1)[1]
    mlflow_port = stack.mlflow_url.rsplit(":", 1)[1]
    dask_port = stack.dask_address.rsplit(":", 1)[1]
    stack.start("prefect-server", [_exe("prefect"), "server", "start", "--host", "127.0.0.1", "--port", prefect_port])
    stack.start("mlflow-server", [
        _exe("mlflow"), "server", "--host", "127.0.0.1", "--port", mlflow_port, "--workers", "1",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--artifacts-destination", str(tmp_path / "mlartifacts"),
    ])
    stack.start("dask-scheduler", [_exe("dask"), "scheduler", "--host", "127.0.0.1", "--port", dask_port, "--no-dashboard"])
    for i in (1, 2):
        stack.start(f"dask-worker-{i}", [
            _exe("dask"), "worker", stack.dask_address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
            "--no-dashboard", "--name", f"e2e-{i}",
        ])
    _wait_http(f"{stack.mlflow_url}/health", stack, "mlflow server")
    _wait_http(f"{stack.prefect_url}/api/health", stack, "prefect server")
    _wait_log(stack, "dask-scheduler", r"Register worker", 2)
    timings["servers"] = time.monotonic() - t0

    t0 = time.monotonic()
    stack.run("work-pool-create", [_exe("prefect"), "work-pool", "create", POOL, "--type", "process"])
    out = stack.run("deploy", [_exe("prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
                    cwd=ROOT)
    assert "hyperband-tune/xgboost-bank-marketing" in out and "hyperband-tune/torch-digits" in out, out
    deployment = _http("GET", f"{stack.prefect_url}/api/deployments/name/{DEPLOYMENT}")
    assert deployment["work_pool_name"] == POOL and deployment["entrypoint"] == "prefect_hyperband.flows.tune:tune"
    assert deployment["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    assert [(s["schedule"]["cron"], s["active"]) for s in deployment["schedules"]] == [("0 2 * * *", False)]  # paused
    torch = _http("GET", f"{stack.prefect_url}/api/deployments/name/hyperband-tune/torch-digits")
    assert torch["parameters"]["model"] == "torch"

    # as a user who installed only the package: `hyperband deploy` replaces the deployment, with no
    # checkout, no pull step, and flow runs starting in the folder it names
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    out = stack.run("hyperband-deploy", [_exe("hyperband"), "deploy", "--pool", POOL, "--name", "xgboost-bank-marketing",
                                         "--working-dir", str(runs_dir), "--no-schedule"], cwd=tmp_path)
    assert f"deployed {DEPLOYMENT} on pool {POOL}" in out, out
    deployment = _http("GET", f"{stack.prefect_url}/api/deployments/name/{DEPLOYMENT}")
    assert deployment["entrypoint"] == "prefect_hyperband.flows.tune.tune" and not deployment["pull_steps"]  # MODULE_PATH form
    assert deployment["job_variables"]["working_dir"] == str(runs_dir) and not deployment["schedules"]
    assert deployment["parameters"]["model"] == "xgboost"
    # the operator points the deployment at their MLflow server and Dask cluster (the UI's Edit does the same)
    _http("PATCH", f"{stack.prefect_url}/api/deployments/{deployment['id']}", {"parameters": {
        **deployment["parameters"], "tracking_uri": stack.mlflow_url, "experiment": EXPERIMENT,
        "dask_address": stack.dask_address, "job_dir": "jobs"}})  # relative: lands in runs_dir
    timings["deploy"] = time.monotonic() - t0

    # the worker runs somewhere else on purpose: the deployment must take the flow run to runs_dir
    worker_cwd = tmp_path / "worker"
    worker_cwd.mkdir()
    stack.start("prefect-worker", [_exe("prefect"), "worker", "start", "--pool", POOL, "--name", "e2e-worker", "--limit", "1"],
                cwd=worker_cwd)

    t0 = time.monotonic()
    # as Prefect users override values: one --param each, merged over the deployment's (its MLflow server kept)
    overrides = {"max_resource": 3, "rounds_per_unit": 2, "job_id": "e2e-job"}
    out = stack.run("deployment-run", [_exe("prefect"), "deployment", "run", DEPLOYMENT, "--flow-run-name", "e2e R=3",
                                       *[a for k, v in overrides.items() for a in ("--param", f"{k}={v}")]])
    match = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert match, out
    flow_run_id = match.group(1)
    state = _wait_for_run(stack, flow_run_id)
    timings["run"] = time.monotonic() - t0
    assert state["type"] == "COMPLETED", f"flow run ended {state['type']}: {state.get('message')}"
    assert (runs_dir / "jobs" / "e2e-job").is_dir() and not (worker_cwd / "jobs").exists()
    assert _http("GET", f"{stack.prefect_url}/api/flow_runs/{flow_run_id}")["name"] == "e2e R=3"  # the name given
    assert not list(tmp_path.rglob("mlflow.db")) or {p.parent for p in tmp_path.rglob("mlflow.db")} == {tmp_path}
    linked, said = _links_logged(stack, flow_run_id)
    assert linked, f"the run's last lines link its MLflow parent run; its MLflow lines: {said}"

    _check_mlflow(stack.mlflow_url)

    t0 = time.monotonic()
    _second_job_keeps_the_better_champion(stack)
    timings["second job"] = time.monotonic() - t0

    t0 = time.monotonic()
    _cancel_and_resume(stack, tmp_path, runs_dir)
    timings["cancel and resume"] = time.monotonic() - t0


def _links_logged(stack: Stack, flow_run_id: str, timeout: float = 30) -> tuple[bool, list[str]]:
    """Whether the run's log links its MLflow parent run (model-training view): its last lines reach the API in the
    process's last batch, which may land after the run's state says Completed."""
    deadline = time.monotonic() + timeout
    while True:
        logs = _http("POST", f"{stack.prefect_url}/api/logs/filter", {
            "logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "sort": "TIMESTAMP_DESC"})
        said = [log["message"] for log in logs if "MLflow" in log["message"] or "registered model" in log["message"]]
        if any(f"{stack.mlflow_url}/#/experiments/" in line and "workflowType=machine_learning" in line for line in said):
            return True, said
        if time.monotonic() > deadline:
            return False, said
        time.sleep(1)


def _second_job_keeps_the_better_champion(stack: Stack) -> None:
    """A second, smaller job on the same data and metric (R=1: one config at one round): @champion stays on the
    better version, and the other is @challenger; a deployment made by an earlier hyperband deploy (one nested
    params object) still runs."""
    from mlflow import MlflowClient

    deployment = _http("GET", f"{stack.prefect_url}/api/deployments/name/{DEPLOYMENT}")
    legacy = {"params": {**deployment["parameters"], "max_resource": 1, "rounds_per_unit": 1, "job_id": "e2e-small"}}
    _http("PATCH", f"{stack.prefect_url}/api/deployments/{deployment['id']}", {"parameters": legacy})
    out = stack.run("deployment-run-2", [_exe("prefect"), "deployment", "run", DEPLOYMENT])
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    state = _wait_for_run(stack, flow_run_id)
    assert state["type"] == "COMPLETED", f"flow run ended {state['type']}: {state.get('message')}"
    client = MlflowClient(stack.mlflow_url)
    versions = client.search_model_versions(f"name = '{EXPERIMENT}'")
    assert len(versions) == 2
    scores = {}
    for v in versions:
        run = client.get_run(v.run_id)
        scores[v.version] = max(m.value for m in client.get_metric_history(v.run_id, "val_auc"))
        assert run.data.metrics["best_val_auc"] == pytest.approx(scores[v.version])
    champion = client.get_model_version_by_alias(EXPERIMENT, "champion").version
    assert scores[champion] == max(scores.values())
    if len(set(scores.values())) == 2:
        assert client.get_model_version_by_alias(EXPERIMENT, "challenger").version != champion


def _state(stack: Stack, flow_run_id: str) -> dict:
    return _http("GET", f"{stack.prefect_url}/api/flow_runs/{flow_run_id}").get("state") or {}


def _cancel_and_resume(stack: Stack, tmp_path: Path, runs_dir: Path) -> None:
    """The bundled user-code deployment on the same pool and worker, cancelled mid-job, then resumed."""
    from mlflow import MlflowClient

    deployment = "hyperband-tune/sklearn-digits-example"
    stack.run("hyperband-deploy-sklearn", [_exe("hyperband"), "deploy", "--pool", POOL, "--name",
                                           "sklearn-digits-example", "--working-dir", str(runs_dir), "--no-schedule"],
              cwd=tmp_path)
    uri = f"sqlite:///{tmp_path / 'cancel-mlflow.db'}"
    jobs = tmp_path / "cancel-jobs"
    # --params merges over the deployment's values: its own code's fields set back to none
    params = {"model": "synthetic", "max_resource": 9, "eta": 3, "unit_seconds": 0.4, "concurrency": 2, "seed": 2,
              "baseline": False, "tracking_uri": uri, "job_dir": str(jobs), "job_id": "cancel-me",
              "trainer": None, "space": None, "metric": None, "direction": None}
    out = stack.run("deployment-run-cancelled", [_exe("prefect"), "deployment", "run", deployment, "--params",
                                                 json.dumps(params)])
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    state_file = jobs / "cancel-me" / "state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (state_file.exists() and len(saved_rows(state_file.parent)) >= 4):
        stack.check_alive()
        time.sleep(0.2)
    assert state_file.exists(), _state(stack, flow_run_id)
    cancelled = time.monotonic()
    stack.run("cancel", [_exe("prefect"), "flow-run", "cancel", flow_run_id])
    final = _wait_for_run(stack, flow_run_id, timeout=120)
    print(f"cancelled in {time.monotonic() - cancelled:.1f} s: {final.get('type')} {final.get('message')}",
          file=sys.stderr)
    assert final.get("type") == "CANCELLED", final
    assert len(saved_rows(state_file.parent)) < 22  # stopped mid-job
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


def _wait_for_run(stack: Stack, flow_run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
    """The flow run's state once it has ended (Completed, Failed, Crashed or Cancelled)."""
    deadline = time.monotonic() + timeout
    state: dict = {}
    while time.monotonic() < deadline:
        stack.check_alive()
        state = _state(stack, flow_run_id)
        if state.get("type") in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} not finished within {timeout}s (last state {state.get('type')})")


def _check_mlflow(url: str) -> None:
    api = f"{url}/api/2.0/mlflow"
    q = urllib.parse.urlencode
    experiment = _http("GET", f"{api}/experiments/get-by-name?{q({'experiment_name': EXPERIMENT})}")["experiment"]
    runs = _http("POST", f"{api}/runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000})["runs"]

    def tags(run):
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    parents = [r for r in runs if "mlflow.parentRunId" not in tags(r) and tags(r).get("hyperband.job_id") == "e2e-job"]
    assert len(parents) == 1, [tags(r) for r in runs]
    parent = parents[0]["info"]
    assert parent["status"] == "FINISHED"
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == parent["run_id"]]
    assert len(children) >= 5, f"{len(children)} child runs; R=3, eta=3 samples 5 configs"  # hyperband plan -R 3
    assert any(m["key"].startswith("val_") for r in children for m in r["data"].get("metrics", []))

    listed = _http("GET", f"{api}/artifacts/list?{q({'run_id': parent['run_id']})}")
    paths = {f["path"] for f in listed.get("files", [])}
    assert "best_config.json" in paths, paths
    with urllib.request.urlopen(f"{url}/get-artifact?{q({'path': 'best_config.json', 'run_id': parent['run_id']})}", timeout=10) as r:
        best = json.loads(r.read())
    assert best["config"] and best["resource"] >= 1 and "val_auc" in best

    alias = _http("GET", f"{api}/registered-models/alias?{q({'name': EXPERIMENT, 'alias': 'champion'})}")
    version = alias["model_version"]
    assert version["name"] == EXPERIMENT and int(version["version"]) >= 1
    assert version["run_id"] in {r["info"]["run_id"] for r in children}
