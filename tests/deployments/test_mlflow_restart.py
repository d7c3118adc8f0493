"""The MLflow tracking server answering 503 for 30 s mid-job, then killed for 10 s and started again, then its
artifact destination unwritable for 30 s at the job's end (a tmpfs remounted read-only): the job finishes with
every run and artifact, one warning line per wait."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from stack import BIN, FlakyProxy, Stack, _exe, _free_port, _wait_http  # noqa: E402  (tests/deployments)

from prefect_hyperband.executors.state import saved_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_a_job_outlives_its_tracking_server_restarting(tmp_path: Path):
    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL

    store = tmp_path / "mlartifacts"  # the server's artifact destination: a filesystem of its own
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(store)], check=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # MLflow's client backs off 2, 4, 8, ... s between retries; 1, 2, 4, ... here, so that a retry lands soon after
    # each window ends (the windows are the 30 s; the waits after them are the client's, not the job's)
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
    stack = Stack(tmp_path, env)
    server = [_exe("mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
              "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
              "--artifacts-destination", str(store)]
    proxy = FlakyProxy(url)  # the job's MLflow: the server, through a proxy that answers 503 when told to
    unwritable: list[float] = []

    def read_only_for_30s() -> None:  # from the job's first upload on: the server's store refuses every write
        subprocess.run(["mount", "-o", "remount,ro", str(store)], check=True)
        unwritable.append(time.monotonic())
        threading.Timer(30, lambda: subprocess.run(["mount", "-o", "remount,rw", str(store)], check=True)).start()

    proxy.on_first_upload = read_only_for_30s
    try:
        first = stack.start("mlflow-1", server)
        _wait_http(f"{url}/health", stack, "MLflow")
        job = subprocess.Popen(
            [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--max-resource", "9",
             "--unit-seconds", "0.3", "--concurrency", "2", "--no-baseline", "--tracking-uri", proxy.url,
             "--job-dir", str(tmp_path / "jobs"), "--job-id", "blip", "--json"],
            cwd=tmp_path, env={**env, "PREFECT_API_URL": PREFECT_API_URL.value()}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        state = tmp_path / "jobs" / "blip" / "state.json"
        deadline = time.time() + 300
        while time.time() < deadline and not (state.exists() and len(saved_rows(state.parent)) >= 4):
            time.sleep(0.1)
        proxy.down_for(30)  # 503 for every request, 30 s
        time.sleep(31)
        rows = len(saved_rows(state.parent))
        os.killpg(first.pid, signal.SIGKILL)  # the tracking server dies mid-job ...
        first.wait(timeout=30)
        stack.procs = [p for p in stack.procs if p[1] is not first]
        time.sleep(10)
        stack.start("mlflow-2", server)  # ... and comes back 10 s later, on the same store
        out, err = job.communicate(timeout=600)
        assert job.returncode == 0, err[-3000:]
        assert rows < 22 and proxy.refused["all"] > 0, (rows, proxy.refused)
        assert unwritable and proxy.failed_uploads > 0, (unwritable, proxy.failed_uploads)  # the store really refused
        waits = [line for line in err.splitlines() if "has not answered for" in line]
        assert 1 <= len(waits) <= 3 and "Traceback" not in err, err[-3000:]  # one line per wait, not per write
        result = json.loads(out.strip().splitlines()[-1])
        assert result["summary"]["trial_rungs"] == 22 and result["summary"]["failed_trials"] == 0
        client = MlflowClient(url)
        assert {"summary.json", "summary.txt"} <= {f.path for f in client.list_artifacts(result["parent_run_id"])}
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == result["parent_run_id"]]
        assert len(children) == 17 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 17
        assert all(r.info.status == "FINISHED" for r in children)
        points = sum(len(client.get_metric_history(r.info.run_id, "val_loss")) for r in children)
        assert points == 69  # every unit's point once: nothing lost, nothing written twice
    finally:
        proxy.close()
        stack.stop()
        subprocess.run(["umount", "-l", str(store)], check=False)
