"""Production's databases: PostgreSQL under a Prefect server and an MLflow server, many jobs against both.

Starts PostgreSQL itself (Debian's ``postgresql`` package: ``initdb`` and ``postgres`` on 127.0.0.1,
a port of its own, trust auth), a Prefect server with ``PREFECT_API_DATABASE_CONNECTION_URL`` on it and
an MLflow server with a PostgreSQL backend store. Ten synthetic (1, 27, 3) jobs run at once, each its own process
and experiment (eight from the CLI, two as deployment runs through a process worker), beside the default XGBoost job
whose champion is registered, while PostgreSQL and then the Prefect server restart under them; then a job starts while PostgreSQL is down (it waits in one line), and three jobs are
SIGKILLed at once (the controller's machine lost) and resumed. Nothing of one job is in another's runs; no run is lost,
repeated or left open.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
from stack import Stack, _exe, _free_port, _http, _wait_http, _wait_log, running, server_env  # noqa: E402  (tests/deployments)

from prefect_hyperband.executors.state import saved_rows

pytestmark = pytest.mark.slow
EXPERIMENT = "pg-hyperband"
POOL = "hyperband-process"
#: the jobs that run as deployment runs through the pool's worker, each a run of its own bundled deployment (each
#: has ``concurrency_limit: 1``), with the job's parameters given at the run
DEPLOYED = {"load-7": "xgboost-bank-marketing", "load-8": "torch-digits"}
#: the job's own line for each kind of outage it waits out (``app.starting``, ``tracking.tracker``, ``app.terminal``,
#: ``flows.groups``): said once per outage, two outages here
OUTAGE_LINES = {"start": "the Prefect API cannot start the job's flow run", "mlflow-wait": "has not answered for",
                "mlflow-back": "answers again after", "events-dropped": "the Prefect API's event stream dropped",
                "events-lost": "the Prefect API's event stream could not", "group": "subflow run did not start",
                "logs": "the Prefect API did not take the job's log lines"}


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


def test_ten_jobs_on_postgresql_outlive_its_restart_and_the_prefect_servers_then_lost_controllers_resume(
        postgres_stack, tmp_path):
    s = postgres_stack
    mlflow_url = _servers(s, tmp_path)
    # ten synthetic (1, 27, 3) jobs (load-1 to load-10), eight from the CLI and load-7 and load-8 as runs of a
    # deployment, started by a process worker; beside them the default job (load-0: XGBoost on bank-marketing at
    # (1, 9, 3)), whose champion is registered
    _deploy(s, tmp_path)
    deployed = [(name, _run_deployment(s, tmp_path, mlflow_url, name)) for name in DEPLOYED]
    for _, run_id in deployed:
        _wait_state(s, run_id, started=True)  # started by the worker before the CLI's jobs start
    jobs = [_job(s, tmp_path, f"load-{i}", mlflow_url, xgboost=i == 0) for i in range(11) if f"load-{i}" not in DEPLOYED]
    time.sleep(15)  # the eleven are still starting (imports, their flow runs) on 2 cores
    assert all(proc.poll() is None for _, proc, _ in jobs), "a job ended before PostgreSQL's restart"
    pg_down = time.time()
    postgres = s.halt("postgres", signal.SIGINT)  # a fast shutdown: every connection dropped
    time.sleep(6)
    s.start("postgres", postgres, cwd=s.pg_data)
    _wait_log(s, "postgres", r"ready to accept connections", 2)
    time.sleep(10)
    ended = {name: (proc.returncode, out.read_text(errors="replace")[-1500:]) for name, proc, out in jobs
             if proc.poll() is not None and name != "load-0"}  # (1, 9, 3): may be done by now
    assert not ended, f"jobs ended before the Prefect server's restart: {ended}"
    prefect_down = time.time()
    prefect = s.halt("prefect-server")
    time.sleep(5)
    s.start("prefect-server", prefect)
    _wait_http(f"http://127.0.0.1:{s.prefect_port}/api/health", s, "prefect server")
    results = [_ended(job) for job in jobs]
    said = [line for _, _, out in jobs for line in out.read_text(errors="replace").splitlines() if "warning" in line.lower()]
    print(f"{len(said)} warning lines from the nine CLI jobs:", *said[:20], sep="\n")
    assert not [line for line in said if "Unable to connect to" in line], "Prefect's own lines: the job's one line"
    raw = [name for name, _, out in jobs if "Error logging to API" in out.read_text(errors="replace")]
    assert not raw, f"Prefect's raw stderr write, the next line glued to it: {raw}"
    for name, _, out in jobs:  # each outage a job saw: one line of its own of each kind, no stream of Prefect's
        lines = [line for line in out.read_text(errors="replace").splitlines() if "warning" in line.lower()]
        kinds = [kind for line in lines for kind, words in OUTAGE_LINES.items() if words in line]
        assert kinds.count("start") <= 1 and max(map(kinds.count, OUTAGE_LINES)) <= 2, f"{name}: {lines}"
    for (name, _, _), result in zip(jobs, results):
        _check_experiment(mlflow_url, name, result, configs=17 if name == "load-0" else 49)
    _check_champion(mlflow_url, "load-0", results[0])
    for name, flow_run_id in deployed:
        _check_experiment(mlflow_url, name, _deployment_ended(s, mlflow_url, name, flow_run_id), configs=49)
        run = _http("GET", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/{flow_run_id}")
        began, ended = (datetime.fromisoformat(run[k]).timestamp() for k in ("start_time", "end_time"))
        print(f"{name} ran {began - pg_down:+.1f} s to {ended - pg_down:+.1f} s from PostgreSQL's stop")
        assert began < pg_down and ended > prefect_down, f"{name} ran {began - pg_down:+.0f} s to " \
            f"{ended - pg_down:+.0f} s from PostgreSQL's stop; the Prefect server stopped at " \
            f"{prefect_down - pg_down:+.0f} s: not under the restarts"
    results = {name: result for (name, _, _), result in zip(jobs, results)}
    flow_runs = _flow_runs(s)
    assert {fr["state"]["type"] for fr in flow_runs} == {"COMPLETED"}
    assert len([fr for fr in flow_runs if fr["parent_task_run_id"] is None]) == 11
    # task runs arrive as events, recorded by the server's task-run recorder; a restart of a server whose broker is
    # in memory (Prefect's default) loses the events it had taken and not yet written: said, not asserted (the jobs'
    # results are all in MLflow and their states, checked above). The ten (1, 27, 3) jobs make 158 task runs each
    # (69 trial-rungs and the baseline, each a train and an evaluate; promotes; the report and end tasks), the
    # (1, 9, 3) one 59: 1,639
    deadline, expected = time.monotonic() + 60, 10 * 158 + 59
    while (task_runs := _http("POST", f"http://127.0.0.1:{s.prefect_port}/api/task_runs/count", {})) < expected:
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    print(f"task runs recorded: {task_runs} of {expected}")

    # a job started while PostgreSQL is down: the Prefect API's /ready answers 503 (its database unreachable), and
    # the job says so in one line and waits, its flow run not yet made, until PostgreSQL is back (Prefect's client
    # alone would retry the flow run's creation silently, up to half an hour). Its MLflow is a local store: only
    # the Prefect server's database is gone
    postgres = s.halt("postgres", signal.SIGINT)
    late = _job(s, tmp_path, "late", f"sqlite:///{tmp_path / 'late-mlflow.db'}", max_resource="9")
    waiting = "hyperband: warning: the Prefect API cannot start the job's flow run (503 Service Unavailable for GET " \
              f"http://127.0.0.1:{s.prefect_port}/api/ready); waiting up to 300 s (--service-wait)"
    deadline = time.monotonic() + 120
    while waiting not in late[2].read_text(errors="replace"):
        assert late[1].poll() is None and time.monotonic() < deadline, late[2].read_text(errors="replace")[-3000:]
        time.sleep(0.5)
    s.start("postgres", postgres, cwd=s.pg_data)
    _wait_log(s, "postgres", r"ready to accept connections", 3)
    uninterrupted = _ended(late)  # the lost jobs' reference, below
    assert (uninterrupted["summary"]["configs"], uninterrupted["summary"]["trial_rungs"],
            uninterrupted["summary"]["failed_trials"]) == (17, 22, 0)
    said = [line for line in late[2].read_text(errors="replace").splitlines() if "warning" in line.lower()]
    assert said == [waiting], said

    # the controller's machine lost: three jobs SIGKILLed at once, mid-job, then each resumed
    lost = [_job(s, tmp_path, f"lost-{i}", mlflow_url, unit_seconds="0.3", max_resource="9") for i in range(3)]
    holders = [_holder_once_training(tmp_path / "jobs" / name) for name, _, _ in lost]
    for _, proc, _ in lost:
        os.killpg(proc.pid, signal.SIGKILL)
    for name, proc, _ in lost:
        proc.wait(timeout=30)
        assert len(saved_rows(tmp_path / "jobs" / name)) < 22, f"{name} ended before it was killed"
    resumed = [_job(s, tmp_path, name, mlflow_url, resume=True) for name, _, _ in lost]
    # the late job (above) is the same synthetic (1, 9, 3) job (seed 0), never killed
    for (name, _, _), job, holder in zip(lost, resumed, holders):
        result = _ended(job)
        _check_experiment(mlflow_url, name, result, configs=17)
        # nothing trained twice, nothing lost: the uninterrupted job's trial-rungs, units and best, exactly
        for key in ("trial_rungs", "resource_used"):
            assert result["summary"][key] == uninterrupted["summary"][key] == {"trial_rungs": 22, "resource_used": 69}[key]
        assert (result["best"]["trial_id"], result["best"]["score"]) == (uninterrupted["best"]["trial_id"],
                                                                         uninterrupted["best"]["score"])
        old = _http("GET", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/{holder['flow_run_id']}")
        assert old["state"]["type"] == "CRASHED" and f"pid {holder['pid']}" in old["state"]["message"], old["state"]
        # what the user sees of it: one line of the resume's, naming the lost process and its flow run
        told = [line for line in job[2].read_text(errors="replace").splitlines() if "previous process" in line]
        assert len(told) == 1 and re.search(
            re.escape(f"the job's previous process (host {holder['host']}, pid {holder['pid']}) was lost; its flow run "
                      f"{holder['flow_run_id']} and ") + r"\d+ under it ended Crashed$", told[0]), told
    flow_runs = _flow_runs(s)
    assert not [fr for fr in flow_runs if fr["state"]["type"] in ("RUNNING", "PENDING")], "flow runs left open"


def _servers(s: Stack, tmp_path: Path) -> str:
    """PostgreSQL with the two servers' databases, the Prefect server and the MLflow server on it; MLflow's URL."""
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
    ], MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW="40")  # as docs/operations.md starts it: a pool its 40 threads never exhaust
    _wait_http(f"http://127.0.0.1:{s.prefect_port}/api/health", s, "prefect server")
    _wait_http(f"{mlflow_url}/health", s, "mlflow server")
    # the Prefect server really is on PostgreSQL
    tables = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(s.pg_port), "-U", "hyperband", "-d", "prefect", "-tAc",
                             "select count(*) from information_schema.tables where table_name = 'flow_run'"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert tables == "1"
    return mlflow_url


def _deploy(s: Stack, tmp_path: Path) -> None:
    """The bundled deployments (``hyperband deploy``, as from an installed package) on a process pool and a worker
    for it; one deployment per job of ``DEPLOYED``."""
    s.run("work-pool", [_exe("prefect"), "work-pool", "create", POOL, "--type", "process"])
    names = [arg for name in DEPLOYED.values() for arg in ("--name", name)]
    out = s.run("hyperband-deploy", [_exe("hyperband"), "deploy", "--pool", POOL, *names, "--working-dir", str(tmp_path),
                                     "--no-schedule"], cwd=tmp_path)
    assert all(f"deployed hyperband-tune/{name} on pool {POOL}" in out for name in DEPLOYED.values()), out
    for name in DEPLOYED.values():  # the runs' processes retry the 500s of the restarts below, as the CLI's jobs do
        deployment = _http("GET", f"http://127.0.0.1:{s.prefect_port}/api/deployments/name/hyperband-tune/{name}")
        assert deployment["job_variables"]["env"]["PREFECT_CLIENT_RETRY_EXTRA_CODES"] == "500", deployment
    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    s.env["PREFECT_WORKER_QUERY_SECONDS"] = "2"  # the worker's poll: its runs start soon after they are made
    # the worker's own client retries a 500 as the runs' processes do (docs/operations.md): without it, a run it
    # was handing to its process as PostgreSQL went down was left PENDING for ever ("Failed to submit flow run",
    # then "Failed to update state": it could not mark the run Crashed either)
    s.env.update(PREFECT_CLIENT_RETRY_EXTRA_CODES="500", PREFECT_CLIENT_MAX_RETRIES="10")
    s.start("prefect-worker", [_exe("prefect"), "worker", "start", "--pool", POOL, "--name", "load-worker",
                               "--limit", str(len(DEPLOYED))], cwd=worker_dir)


def _run_deployment(s: Stack, tmp_path: Path, mlflow_url: str, name: str) -> str:
    """A run of job ``name``'s deployment with that job's parameters (a synthetic (1, 27, 3) job, as the CLI's, with
    0.2 s units: the CLI's take 0.05 s); its flow run id."""
    params = {"model": "synthetic", "max_resource": 27, "unit_seconds": 0.2, "eta": 3, "concurrency": 2, "workers": 1,
              "experiment": name, "job_id": name, "tracking_uri": mlflow_url, "job_dir": str(tmp_path / "jobs")}
    out = s.run(f"run-{name}", [_exe("prefect"), "deployment", "run", f"hyperband-tune/{DEPLOYED[name]}", "--params",
                                json.dumps(params)])  # merged over the deployment's values
    match = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert match, out
    return match.group(1)


def _wait_state(s: Stack, run_id: str, started: bool, timeout: float = 120) -> None:
    """Until the worker has handed the flow run to its process (PENDING), or (``started``) the process runs it."""
    deadline = time.monotonic() + timeout
    while True:
        run = _http("GET", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/{run_id}")
        if (run["start_time"] is not None) if started else run["state"]["type"] == "PENDING":
            return
        assert time.monotonic() < deadline, f"the worker did not start flow run {run_id} within {timeout:.0f} s"
        time.sleep(0.2)


def _deployment_ended(s: Stack, mlflow_url: str, name: str, flow_run_id: str, timeout: float = 600) -> dict:
    """A deployment run's outcome, as ``_ended`` gives a CLI job's: its flow run COMPLETED, and the job's summary
    (``summary.json`` on its parent run), best trial and parent run."""
    deadline, state = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        state = _http("GET", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/{flow_run_id}").get("state") or {}
        if state.get("type") in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(2)
    assert state.get("type") == "COMPLETED", f"{name}: flow run ended {state.get('type')}: {state.get('message')}"
    api = f"{mlflow_url}/api/2.0/mlflow"
    experiment = _http("GET", f"{api}/experiments/get-by-name?experiment_name={name}")["experiment"]
    runs = _http("POST", f"{api}/runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000,
                                                "filter": "tags.`hyperband.job_id` = '" + name + "'"})["runs"]
    parent = [r["info"]["run_id"] for r in runs
              if not any(t["key"] == "mlflow.parentRunId" for t in r["data"].get("tags", []))]
    assert len(parent) == 1, f"{name}: {len(parent)} parent runs"
    import urllib.request

    with urllib.request.urlopen(f"{mlflow_url}/get-artifact?path=summary.json&run_uuid={parent[0]}", timeout=10) as r:
        summary = json.loads(r.read())
    return {"summary": summary, "parent_run_id": parent[0],
            "best": {"trial_id": summary["best_trial"], "resource": summary["best_resource"]}}


def _job(s: Stack, tmp_path: Path, name: str, mlflow_url: str, unit_seconds: str = "0.05", resume: bool = False,
         xgboost: bool = False, max_resource: str = "27") -> tuple[str, subprocess.Popen, Path]:
    """``hyperband tune`` of a synthetic (1, R, 3) job (or the default XGBoost one at (1, 9, 3)) in its own process
    and experiment."""
    out = tmp_path / f"{name}{'-resume' if resume else ''}.out"
    model = ["--max-resource", "9", "--rounds-per-unit", "2"] if xgboost else [
        "--model", "synthetic", "--max-resource", max_resource, "--unit-seconds", unit_seconds]
    which = ["--resume", name] if resume else [*model, "--eta", "3", "--concurrency", "2", "--experiment", name,
                                               "--job-id", name]
    argv = [_exe("hyperband"), "tune", *which, "--tracking-uri", mlflow_url, "--job-dir", str(tmp_path / "jobs"), "--json"]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, env=s.env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return name, proc, out


def _ended(job: tuple[str, subprocess.Popen, Path]) -> dict:
    name, proc, out = job
    code = proc.wait(timeout=600)
    text = out.read_text(errors="replace")
    assert code == 0 and "Traceback" not in text, f"{name} exited {code}:\n{text[-3000:]}"
    assert "View run" not in text  # MLflow's line per ended run against a tracking server: off the terminal
    # the --json line is the job's last on stdout; stderr shares the file here, and Prefect's events client can say
    # at exit that its stream dropped (one warning line, after the JSON: it follows the Prefect server's restart)
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def _check_experiment(mlflow_url: str, name: str, result: dict, configs: int = 49) -> None:
    """The job's experiment: its parent FINISHED, a child run per config FINISHED with distinct trial ids, none
    open, the best trial's metric at every unit it trained."""
    assert result["summary"]["configs"] == configs and result["summary"]["failed_trials"] == 0, result["summary"]
    api = f"{mlflow_url}/api/2.0/mlflow"
    experiment = _http("GET", f"{api}/experiments/get-by-name?experiment_name={name}")["experiment"]
    runs = _http("POST", f"{api}/runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000})["runs"]

    def tags(run):
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    parents = [r for r in runs if "mlflow.parentRunId" not in tags(r)]
    assert [p["info"]["run_id"] for p in parents] == [result["parent_run_id"]], f"{name}: {len(parents)} parent runs"
    assert parents[0]["info"]["status"] == "FINISHED"
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == result["parent_run_id"]]
    assert len(children) == len(runs) - 1  # nothing of another job
    finished = [r for r in children if r["info"]["status"] == "FINISHED"]
    assert len(finished) == configs and len({tags(r)["hyperband.trial_id"] for r in finished}) == configs, name
    left = [(tags(r)["hyperband.trial_id"], r["info"]["status"], tags(r).get("hyperband.status")) for r in children
            if r["info"]["status"] != "FINISHED"]
    assert all(status == "KILLED" and why == "abandoned" for _, status, why in left), left
    winner = next(r for r in finished if tags(r)["hyperband.trial_id"] == result["best"]["trial_id"])
    metric = result["summary"]["metric"]
    history = _http("GET", f"{api}/metrics/get-history?run_id={winner['info']['run_id']}&metric_key={metric}")["metrics"]
    assert sorted(m["step"] for m in history)[-1] == result["best"]["resource"]


def _check_champion(mlflow_url: str, name: str, result: dict) -> None:
    """The best model registered on the PostgreSQL-backed registry, alias ``champion`` on the best trial's run."""
    api = f"{mlflow_url}/api/2.0/mlflow"
    alias = _http("GET", f"{api}/registered-models/alias?name={name}&alias=champion")["model_version"]
    assert alias["run_id"] == result["best"]["run_id"]


def _flow_runs(s: Stack) -> list[dict]:
    found, offset = [], 0
    while page := _http("POST", f"http://127.0.0.1:{s.prefect_port}/api/flow_runs/filter",
                        {"limit": 200, "offset": offset}):
        found, offset = found + page, offset + len(page)
    return found


def _holder_once_training(job_dir: Path, timeout: float = 180) -> dict:
    """The job's lock (its pid and flow run) once its state holds some of its 22 results: a job mid-way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (job_dir / "lock").exists() and len(saved_rows(job_dir)) >= 6:
            return json.loads((job_dir / "lock").read_text())
        time.sleep(0.5)
    raise AssertionError(f"{job_dir.name} wrote no results within {timeout:.0f}s")
