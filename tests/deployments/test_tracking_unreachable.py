"""Tracking robustness: an unreachable server stops the job before any training, in one line;
a transient tracking error mid-job is retried by the tasks of ``tasks.record``."""

from __future__ import annotations

import socket

from prefect_hyperband.app import cli


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"http://127.0.0.1:{_closed_port()}"

    from prefect_hyperband.trainers import factory

    def no_training(*args, **kwargs):
        raise AssertionError("training started although the tracking server is unreachable")

    monkeypatch.setattr(factory, "get", no_training)
    code = cli.main(["tune", "--max-resource", "3", "--eta", "3", "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", uri])
    assert code == cli.EXIT_USAGE == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hyperband: error: ")
    assert uri in err and "not reachable" in err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "mlflow.db").exists()


def test_unreachable_tracking_server_from_the_installed_command(tmp_path):
    """The same through the console script: nothing but the one line on stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    uri = f"http://127.0.0.1:{_closed_port()}"
    exe = Path(sys.executable).parent / "hyperband"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "prefect_hyperband.app.cli"]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.run(
        [*command, "tune", "--max-resource", "3", "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", uri],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and uri in lines[0], proc.stderr
    assert proc.stdout == ""


def _job(uri: str):
    from prefect_hyperband.executors.job import Job
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.factory import TrainerSettings

    return Job(
        job_id="retry-test", job_dir="/tmp/unused", settings=TrainerSettings(model="xgboost", data=DataSpec()),
        metric="auc", direction="max", min_resource=1, max_resource=3, eta=3, seed=0, space={}, default_config={},
        tracking_uri=uri, experiment="retry", concurrency=1,
    )


def test_the_end_tasks_retry_inside_not_as_task_retries():
    """Each task of the job's end retries its writes as every MLflow write does (``retrying``, bounded by MLflow's
    client's own wait); Prefect's retries on top would wait that whole bound again, three times."""
    from prefect import Task

    from prefect_hyperband.tasks import front_report, record

    found = {name: t for module in (record, front_report) for name, t in vars(module).items() if isinstance(t, Task)}
    assert set(found) == {"finish_job_run", "register_champion", "keep_best_checkpoint", "log_front"}
    assert {name: t.retries for name, t in found.items()} == {name: 0 for name in found}


def test_a_transient_tracking_error_is_retried(prefect_harness, tracking_uri, monkeypatch):
    from prefect import flow

    from prefect_hyperband.tasks import record
    from prefect_hyperband.tracking import runs as tracking

    calls = []
    real = tracking.start_parent

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise ConnectionError("tracking server blipped")
        return real(*args, **kwargs)

    monkeypatch.setattr(tracking, "start_parent", flaky)

    @flow
    def job(uri: str) -> str:
        return record.start_job_run(_job(uri), {"eta": 3})

    state = job(tracking_uri, return_state=True)
    assert state.is_completed(), state.message
    run_id = state.result()
    assert len(calls) == 2

    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.data.params == {"eta": "3"} and run.data.tags["hyperband.job_id"] == "retry-test"


def test_per_trial_writes_are_retried(monkeypatch):
    """Trial runs are written from the driver's threads without a task run per write; a blip is retried."""
    from prefect_hyperband.tracking import records

    calls = []

    def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError("tracking server blipped")
        return x * 2

    assert records.retrying(flaky, 21, delays=(0, 0, 0)) == 42 and len(calls) == 3

    def down():
        calls.append(None)
        raise ConnectionError("down")

    calls.clear()
    try:
        records.retrying(down, delays=(0, 0))
    except ConnectionError:
        pass
    else:
        raise AssertionError("the last failure must propagate")
    assert len(calls) == 3


def test_a_write_that_waited_out_mlflows_own_retries_is_not_tried_again(monkeypatch):
    """MLflow's client already retried a server that does not answer for about --service-wait: that failure is the
    last try (four of them would make a write wait four times --service-wait). A quick blip is tried again."""
    from types import SimpleNamespace

    from prefect_hyperband.tracking import records, service_wait

    now = [0.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda seconds: now.__setitem__(0, now[0] + seconds))
    monkeypatch.setattr(records, "time", clock)
    monkeypatch.setattr(service_wait, "client_waits", lambda: 364.0)
    calls = []

    def gone():
        calls.append(now[0])
        now[0] += 364.0  # the client's own retries
        raise ConnectionError("Max retries exceeded (too many 503 error responses)")

    try:
        records.retrying(gone)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the failure must propagate")
    assert calls == [0.0]

    calls.clear()
    now[0] = 0.0

    def blip():
        calls.append(now[0])
        raise ConnectionError("database is locked")

    try:
        records.retrying(blip)
    except ConnectionError:
        pass
    assert calls == [0.0, 1.0, 6.0, 21.0]  # DELAYS 1, 5, 15 s apart
