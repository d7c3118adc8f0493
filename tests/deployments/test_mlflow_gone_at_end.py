"""A real MLflow server that stops answering after the job's last result, while the job writes its end (the
summary's artifacts): one line and exit 75 within about --service-wait, every result saved; --resume, with the
server back, writes the end and trains nothing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stack import BIN, FlakyProxy, Stack, _exe, _free_port, _wait_http  # noqa: E402  (tests/deployments)

from prefect_hyperband.executors.state import saved_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


class GoneAtTheSummary(FlakyProxy):
    """503 to every request from the upload of the parent run's ``summary.json`` on, until told otherwise."""

    gone_at: float | None = None

    def refusing(self, method: str, path: str) -> str | None:
        if method == "PUT" and path.endswith("/summary.json") and not self.until:
            self.gone_at = time.monotonic()
            self.down_for(3600)
        return super().refusing(method, path)


def test_mlflow_gone_while_the_job_writes_its_end_stops_it_in_one_line_and_resume_finishes(tmp_path: Path):
    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # MLflow's client backs off 1, 2, 4, ... s here: --service-wait 10 makes it retry 4 times, about 14 s
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1", PREFECT_API_URL=PREFECT_API_URL.value())
    stack = Stack(tmp_path, env)
    proxy = GoneAtTheSummary(url)
    tune = [sys.executable, "-m", "prefect_hyperband.app.cli", "tune"]
    where = ["--job-dir", str(tmp_path / "jobs"), "--tracking-uri", proxy.url, "--json"]
    try:
        stack.start("mlflow", [_exe("mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                               "--artifacts-destination", str(tmp_path / "mlartifacts")])
        _wait_http(f"{url}/health", stack, "MLflow")
        began = time.monotonic()
        job = subprocess.run(
            [*tune, "--model", "synthetic", "--max-resource", "9", "--eta", "3", "--no-baseline", "--job-id", "end",
             "--service-wait", "10", *where],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        took = time.monotonic() - (proxy.gone_at or began)  # from MLflow going away to the job's exit
        assert job.returncode == 75, job.stderr[-3000:]
        said = [line for line in job.stderr.splitlines() if line.startswith("hyperband: job end stopped: ")]
        assert len(said) == 1 and "Traceback" not in job.stderr, job.stderr[-3000:]
        errors = [line for line in job.stderr.splitlines() if "| ERROR" in line]  # e.g. the task run's own Failed
        assert not errors, errors
        assert "MLflow did not answer within 10 s (--service-wait) while the job's end was written" in said[0]
        # about the client's bound (4 retries, 1 + 2 + 4 + 8 s here) and the job's exit; four times it would be ~60 s
        assert proxy.refused["all"] > 0 and took < 40, (proxy.refused, took)
        print(f"MLflow gone to exit: {took:.1f} s; {said[0]}")
        assert len(saved_rows(tmp_path / "jobs" / "end")) == 22  # every trial-rung saved
        proxy.until = -1.0  # the server answers again (and the summary's upload no longer takes it away)
        resumed = subprocess.run([*tune, "--resume", "end", *where], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        result = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert result["summary"]["trial_rungs"] == 22 and len(saved_rows(tmp_path / "jobs" / "end")) == 22
        client = MlflowClient(url)
        parent = client.get_run(result["parent_run_id"])
        assert parent.info.status == "FINISHED"
        assert {"summary.json", "summary.txt"} <= {f.path for f in client.list_artifacts(parent.info.run_id)}
        runs = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        assert len(runs) == 17 and len({r.data.tags["hyperband.trial_id"] for r in runs}) == 17
        assert all(r.info.status == "FINISHED" for r in runs)
    finally:
        proxy.close()
        stack.stop()
