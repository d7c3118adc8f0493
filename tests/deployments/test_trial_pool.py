"""Trials across machines, end to end: a real Prefect server, a process work pool and two workers started in
two different folders (two machines, as far as one host can stand in for them), then ``hyperband tune
--trial-pool``: with ``s3://`` on an S3-compatible server (moto, through s3fs) as ``--storage`` while one worker
is killed mid-job, then a job with a shared folder as ``--storage`` stopped by Ctrl-C and resumed. The S3 job must
equal the same job run in one process: the same trials, scores, resource used and MLflow shape.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from stack import Stack, _exe, _free_port, _http, _wait_http, _wait_log, running, server_env  # noqa: E402  (tests/deployments)

pytestmark = pytest.mark.slow

POOL = "hyperband-trials"
JOB = ["--model", "xgboost", "--data", "breast-cancer", "--min-resource", "1", "--max-resource", "9", "--eta", "3",
       "--rounds-per-unit", "2", "--seed", "3", "--no-baseline", "--no-register-model", "--concurrency", "2", "--json"]


@pytest.fixture
def stack(request, tmp_path):
    prefect_port, s3_port = _free_port(), _free_port()
    env = server_env(
        tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", prefect_port,
        PREFECT_WORKER_QUERY_SECONDS="1",  # a worker asks for work every second (10 by default)
        HYPERBAND_NO_LIVE="1",
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}",
    )
    with running(request, tmp_path, env) as s:
        s.prefect_url, s.s3_url = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{s3_port}"
        yield s


def test_trial_rungs_on_two_workers_s3_with_a_worker_killed_then_a_shared_folder_cut_and_resumed(stack, tmp_path):
    _scenario(stack, tmp_path)


def _scenario(stack: Stack, tmp: Path) -> None:
    port = stack.prefect_url.rsplit(":", 1)[1]
    stack.start("prefect-server", [_exe("prefect"), "server", "start", "--host", "127.0.0.1", "--port", port])
    stack.start("s3-server", [_exe("moto_server"), "-H", "127.0.0.1", "-p", stack.s3_url.rsplit(":", 1)[1]])
    _wait_http(f"{stack.prefect_url}/api/health", stack, "prefect server")
    _wait_http(stack.s3_url, stack, "s3 server")
    stack.run("work-pool-create", [_exe("prefect"), "work-pool", "create", POOL, "--type", "process"])
    workers = {}
    for name in ("machine-a", "machine-b"):
        (tmp / name).mkdir()
        workers[name] = stack.start(name, [_exe("prefect"), "worker", "start", "--pool", POOL, "--name", name],
                                    cwd=tmp / name)
    for name in workers:
        _wait_log(stack, name, r"started!", 1)

    # the reference: the same job in one process, (1, 3, 3): 6 trial-rungs (each one on the pool is a flow run in
    # a process of its own, seconds to start: a larger job adds minutes, not coverage)
    small = _tune(stack, tmp, "small", ["--max-resource", "3"])

    # an object store, and machine B dies while it trains: its trial-rung runs again on A. The heartbeat timeout is
    # 20 s (60 by default): at 8 s, a CI machine running the suite on 2 cores took live runs for dead, up to three
    # times for one trial-rung, whose trial then failed
    stack.run("make-bucket", [str(Path(_exe("python"))), "-c",
                              "import s3fs; s3fs.S3FileSystem().mkdir('hyperband-bucket')"])
    proc = _start_tune(stack, tmp, "s3-job", ["--trial-pool", POOL, "--storage", "s3://hyperband-bucket/jobs",
                                              "--max-resource", "3"], HYPERBAND_HEARTBEAT_TIMEOUT="20")
    os.kill(workers["machine-a"].pid, signal.SIGSTOP)  # A stops asking for work until B has a trial-rung running
    try:
        killed = _kill_mid_trial_rung(stack, workers["machine-b"])
    finally:
        os.kill(workers["machine-a"].pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=420)
    (tmp / "s3-job.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    s3 = _result(out)
    _same_job(small, {**s3, "mlflow": _mlflow_shape(f"sqlite:///{tmp}/mlflow-s3-job.db", s3["parent_run_id"])})
    assert re.search(r"running it again", out), "the killed worker's trial-rung was not run again"
    flow_runs = _http("POST", f"{stack.prefect_url}/api/flow_runs/filter",
                      {"flow_runs": {"tags": {"all_": ["job:s3-job"]}}, "limit": 200})
    states = [r["state_type"] for r in flow_runs]
    assert states.count("COMPLETED") == 6 and states.count("CRASHED") >= 1, states
    assert killed in {r["id"] for r in flow_runs if r["state_type"] == "CRASHED"}
    assert all(r["parent_task_run_id"] for r in flow_runs)  # subflows of the job's flow run, linked in the UI
    for name in workers:  # both "machines" trained trial-rungs (B the one it died in)
        assert _submitted(stack, name) >= 1, f"{name} ran {_submitted(stack, name)} trial-rungs"
    keys = stack.run("list-bucket", [str(Path(_exe("python"))), "-c",
                                     "import s3fs; print('\\n'.join(s3fs.S3FileSystem().find('hyperband-bucket/jobs')))"])
    assert "hyperband-bucket/jobs/s3-job/state.json" in keys and "hyperband-bucket/jobs/s3-job/job.json" in keys
    assert len([k for k in keys.split() if "/checkpoints/" in k]) == 6
    assert not [k for k in keys.split() if "/results/" in k or "/heartbeats/" in k]  # read and removed
    # the state round-trips through the bucket: a resume reads it and has nothing left to train
    resumed = _result(stack.run("s3-resume", [  # the saved job's flags; only where it is and its MLflow store
        _exe("hyperband"), "tune", "--resume", "s3-job", "--storage", "s3://hyperband-bucket/jobs", "--json",
        "--job-dir", str(tmp / "s3-job-dir"), "--tracking-uri", f"sqlite:///{tmp}/mlflow-s3-job.db"], timeout=420))
    assert resumed["summary"]["best_score"] == s3["summary"]["best_score"]
    assert "6 trial-rungs kept" in (tmp / "s3-resume.log").read_text()

    # a shared folder for the checkpoints and the state, and Ctrl-C on the controller: the flow runs in flight are
    # cancelled, the job exits 130 and resumes on the pool
    shared = tmp / "shared"
    argv = [_exe("hyperband"), "tune", "--model", "synthetic", "--unit-seconds", "0.5", "--max-resource", "3",
            "--no-baseline", "--no-register-model", "--concurrency", "2", "--trial-pool", POOL, "--job-id", "cut",
            "--storage", str(shared), "--tracking-uri", f"sqlite:///{tmp}/mlflow-cut.db", "--json"]
    proc = subprocess.Popen(argv, cwd=tmp, env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_runs(stack, "job:cut", "RUNNING", 1)
    began = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - began < 20, out[-3000:]
    assert "--resume cut" in out
    cut = _wait_for_runs(stack, "job:cut", "CANCELLED", 1)
    assert not [r for r in cut if r["state_type"] in ("RUNNING", "PENDING", "SCHEDULED")], [r["state_type"] for r in cut]
    resumed = _result(stack.run("cut-resume", [_exe("hyperband"), "tune", "--resume", "cut", "--storage", str(shared),
                                               "--tracking-uri", f"sqlite:///{tmp}/mlflow-cut.db", "--json"], timeout=300))
    assert resumed["summary"]["trial_rungs"] == 6 and resumed["summary"]["lost_worker_seconds"] > 0
    shape = _mlflow_shape(f"sqlite:///{tmp}/mlflow-cut.db", resumed["parent_run_id"])
    assert len(shape) == 5, shape  # (1, 3, 3): 5 configs, one child run each
    assert (shared / "cut" / "state.json").is_file()  # the job's state and checkpoints in the shared folder
    assert len({p.parent.name for p in (shared / "cut" / "checkpoints").rglob("r*.*")}) == 5


def _wait_for_runs(stack: Stack, tag: str, state: str, count: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _http("POST", f"{stack.prefect_url}/api/flow_runs/filter", {"flow_runs": {"tags": {"all_": [tag]}}})
        if sum(r["state_type"] == state for r in runs) >= count:
            return runs
        time.sleep(0.3)
    raise AssertionError(f"no {count} {state} flow runs tagged {tag} within {timeout:.0f} s")


def _job_argv(tmp: Path, job_id: str, extra: list[str]) -> list[str]:
    """``hyperband tune`` with the shared job flags, this job's id and its own MLflow store."""
    return [_exe("hyperband"), "tune", *JOB, "--job-id", job_id, "--tracking-uri", f"sqlite:///{tmp}/mlflow-{job_id}.db",
            *extra]


def _start_tune(stack: Stack, tmp: Path, job_id: str, extra: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(_job_argv(tmp, job_id, extra), cwd=tmp, env={**stack.env, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


def _tune(stack: Stack, tmp: Path, job_id: str, extra: list[str]) -> dict:
    result = _result(stack.run(job_id, _job_argv(tmp, job_id, extra), timeout=420))
    result["mlflow"] = _mlflow_shape(f"sqlite:///{tmp}/mlflow-{job_id}.db", result["parent_run_id"])
    return result


def _result(out: str) -> dict:
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


def _mlflow_shape(uri: str, parent_run_id: str) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_run(parent_run_id).info.experiment_id], max_results=1000)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run_id]
    shape = {}
    for r in children:
        name = r.data.tags["mlflow.runName"]
        assert name not in shape, f"two child runs named {name}"
        assert r.info.status in ("FINISHED", "FAILED"), (name, r.info.status)  # nothing left RUNNING
        history = client.get_metric_history(r.info.run_id, "val_auc")
        shape[name] = (r.info.status, dict(r.data.params), sorted((m.step, round(m.value, 12)) for m in history))
    return shape


def _same_job(local: dict, other: dict) -> None:
    assert other["summary"]["best_score"] == local["summary"]["best_score"]
    assert other["summary"]["resource_used"] == local["summary"]["resource_used"]
    assert other["best"]["trial_id"] == local["best"]["trial_id"]
    mine = other.get("mlflow") or {}
    if mine:
        assert mine == local["mlflow"]


def _submitted(stack: Stack, worker: str) -> int:
    return len(re.findall(r"Worker '[^']+' submitting flow run", (stack.tmp / f"{worker}.log").read_text(errors="replace")))


def _kill_mid_trial_rung(stack: Stack, worker: subprocess.Popen) -> str:
    """Wait for the worker to start a trial flow run of this job, then kill it with everything it started (a
    machine that dies: nothing tells the Prefect server). The flow run's id."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        running = _http("POST", f"{stack.prefect_url}/api/flow_runs/filter",
                        {"flow_runs": {"tags": {"all_": ["job:s3-job"]}, "state": {"type": {"any_": ["RUNNING"]}}}})
        mine = _children_running(worker)
        for run in running:
            if run["id"] in mine:
                for p in [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                worker.wait(timeout=10)
                return run["id"]
        time.sleep(0.3)
    raise AssertionError("machine-b never ran a trial-rung of the s3 job")


def _children_running(worker: subprocess.Popen) -> set[str]:
    """Flow-run ids that this worker's child processes run (from their environment)."""
    ids = set()
    for p in psutil.Process(worker.pid).children(recursive=True):
        try:
            run_id = p.environ().get("PREFECT__FLOW_RUN_ID")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if run_id:
            ids.add(run_id)
    return ids
