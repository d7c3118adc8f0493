"""Ending the trials' MLflow runs: against a tracking server several at once, each run's writes in order."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tasks import record
from prefect_hyperband.tracking import runs as tracking


def _trials(n: int) -> list[TrialRecord]:
    return [TrialRecord(f"s0-{i:04d}", 0, {}, "failed" if i == 3 else "stopped", 0, 1, {1: 0.5}, "boom" if i == 3
                        else None) for i in range(n)]


@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple[str, str, str]] = []  # (what, run, thread)
    lock = threading.Lock()
    gate = threading.Barrier(2, timeout=5)  # two runs in flight at once, or the test times out

    def set_tags(uri, run_id, tags):
        if run_id in ("run-0", "run-1") and uri.startswith("http"):
            gate.wait()
        with lock:
            seen.append(("tags", run_id, tags["hyperband.status"]))

    def end_run(uri, run_id, status):
        with lock:
            seen.append(("end", run_id, status))

    monkeypatch.setattr(tracking, "set_tags", set_tags)
    monkeypatch.setattr(tracking, "end_run", end_run)
    return seen


def test_against_a_tracking_server_many_runs_end_several_at_once_each_in_order(calls):
    job = SimpleNamespace(tracking_uri="http://127.0.0.1:5000")
    n = record.CLOSE_AT_ONCE_FROM
    record.close_trial_runs(job, _trials(n), {f"s0-{i:04d}": f"run-{i}" for i in range(n)})
    assert sorted(r for w, r, _ in calls if w == "end") == sorted(f"run-{i}" for i in range(n))
    for i in range(n):  # a run's tags before its end
        mine = [w for w, r, _ in calls if r == f"run-{i}"]
        assert mine == ["tags", "end"]
    assert ("end", "run-3", "FAILED") in calls


def test_against_a_tracking_server_a_few_runs_end_one_by_one(calls):
    """A rung's close, every few seconds of a job: many jobs share the server, and eight at once from each stalled it."""
    job = SimpleNamespace(tracking_uri="http://127.0.0.1:5000")
    n = record.CLOSE_AT_ONCE_FROM - 1
    record.close_trial_runs(job, _trials(n), {f"s0-{i:04d}": f"r-{i}" for i in range(n)})  # no run-0/1: no gate
    assert [(w, r) for w, r, _ in calls] == [(w, f"r-{i}") for i in range(n) for w in ("tags", "end")]


def test_a_local_store_ends_them_one_by_one_and_a_trial_with_no_run_is_skipped(calls):
    job = SimpleNamespace(tracking_uri="sqlite:///x.db")
    record.close_trial_runs(job, _trials(4), {"s0-0000": "run-0", "s0-0002": "run-2"})
    assert [(w, r) for w, r, _ in calls] == [("tags", "run-0"), ("end", "run-0"), ("tags", "run-2"), ("end", "run-2")]


def test_a_run_that_cannot_be_ended_past_its_retries_fails_the_call(monkeypatch, calls):
    def refuse(uri, run_id, status):
        if run_id == "r-5":
            raise ConnectionError("gone")

    monkeypatch.setattr(tracking, "end_run", refuse)
    monkeypatch.setattr(record.retrying, "__kwdefaults__", {"delays": (), "within": None})  # no waits between tries here
    for n in (8, record.CLOSE_AT_ONCE_FROM):  # one by one, and several at once
        with pytest.raises(ConnectionError, match="gone"):
            record.close_trial_runs(SimpleNamespace(tracking_uri="https://mlflow"), _trials(n),
                                    {f"s0-{i:04d}": f"r-{i}" for i in range(n)})


def test_a_champion_registered_before_the_jobs_end_was_cut_short_is_not_registered_again(tmp_path, monkeypatch):
    """MLflow went away after the champion's registration (before its alias, or before the summary): the write tried
    again, or --resume writing the job's end again, finds the version by its tags, aliases it, registers nothing;
    the same trial trained further since, or another job's, is a new version. A real store: MLflow's own search."""
    _champion_found_again(f"sqlite:///{tmp_path / 'mlflow.db'}", monkeypatch)


@pytest.mark.slow
def test_a_champion_is_found_again_through_a_tracking_servers_rest_api(tmp_path, monkeypatch):
    """The same through ``mlflow server``: the searches by run id and by tags go over REST to its store."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                               str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'store.db'}",
                               "--artifacts-destination", str(tmp_path / "artifacts")],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        monkeypatch.chdir(tmp_path)
        _champion_found_again(url, monkeypatch)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _champion_found_again(uri: str, monkeypatch) -> None:
    import mlflow
    import numpy as np
    import xgboost as xgb

    from prefect_hyperband.tracking import champion

    c = tracking.client(uri)
    run_id = c.create_run(c.create_experiment("e")).info.run_id
    booster = xgb.train({"verbosity": 0}, xgb.DMatrix(np.eye(4), label=[0, 1, 0, 1]), num_boost_round=1)
    logged = []

    def log_model(trainer, checkpoint):
        logged.append(checkpoint)
        return mlflow.xgboost.log_model(booster, name="model", pip_requirements=["xgboost"])

    model = SimpleNamespace(log_model=log_model)
    alias = c.set_registered_model_alias
    cut = []

    def gone_once(*args):  # MLflow goes away right after the registration
        if not cut:
            cut.append(args)
            raise ConnectionError("gone")
        alias(*args)

    monkeypatch.setattr(type(c), "set_registered_model_alias", lambda self, *a: gone_once(*a))
    monkeypatch.setattr(tracking, "client", lambda u: c)
    register = mlflow.register_model

    def register_gone_once(*args, **kwargs):  # MLflow goes away between the model's upload and its registration
        if not cut:
            cut.append(args)
            raise ConnectionError("gone")
        return register(*args, **kwargs)

    parent = c.create_run(c.get_run(run_id).info.experiment_id).info.run_id
    built = []
    log = lambda step, job="j1": champion.log_champion(uri, run_id, model, lambda: built.append(step), "/ckpt", "e",  # noqa: E731
                                                       {"auc": 0.9}, lambda: built.append("data"),
                                                       parent_run_id=parent, step=step, job_id=job)
    monkeypatch.setattr(mlflow, "register_model", register_gone_once)
    with pytest.raises(ConnectionError):
        log(9)
    assert len(logged) == 1 and not c.search_model_versions("name = 'e'")
    monkeypatch.setattr(mlflow, "register_model", register)
    cut.clear()
    with pytest.raises(ConnectionError):  # now after the registration, before the alias
        log(9)
    assert log(9).version == 1 and log(9).version == 1 and len(logged) == 1  # the model logged once, registered once
    # the trainer (which may load the data) built only to log it; the dataset (its digest reads every row) only to
    # link the metrics, before the version is registered: not for a version found registered
    assert built == [9, "data", "data"]
    assert len(c.get_run(parent).outputs.model_outputs) == 1  # listed once on the parent run
    assert int(c.get_model_version_by_alias("e", champion.CHAMPION).version) == 1
    assert log(27).version == 2 and log(9, job="j2").version == 3 and len(logged) == 3  # trained further; another job's
    assert sorted(int(v.version) for v in c.search_model_versions("name = 'e'")) == [1, 2, 3]


def test_a_plug_in_that_takes_tags_logs_its_model_born_tagged_so_a_cut_just_after_it_logs_it_once(tmp_path,
                                                                                                    monkeypatch):
    """The built-in plug-ins pass the job's tags to the flavour's ``log_model``: MLflow gone right after the upload
    (before any other write) leaves a model the retry finds. Tagged after the upload, as before (and still for a
    plug-in without ``tags``), that cut left an untagged model and the retry logged a second one."""
    import mlflow
    import numpy as np
    import xgboost as xgb

    from prefect_hyperband.tracking import champion

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    monkeypatch.setattr(tracking, "client", lambda u: c)
    run_id = c.create_run(c.create_experiment("e")).info.run_id
    booster = xgb.train({"verbosity": 0}, xgb.DMatrix(np.eye(4), label=[0, 1, 0, 1]), num_boost_round=1)
    logged, cut = [], []

    def log_model(trainer, checkpoint, tags=None):
        info = mlflow.xgboost.log_model(booster, name="model", pip_requirements=["xgboost"], tags=tags)
        logged.append(tags)
        return info

    def gone_right_after_the_upload(original):  # MLflow's next call after the model's upload fails, once
        def call(self, *args):
            if logged and not cut and not (args[1:] and "mlflow.modelVersions" in args[1]):
                cut.append(original.__name__)
                raise ConnectionError("gone")
            return original(self, *args)
        return call

    for name in ("set_logged_model_tags", "get_metric_history"):  # the first: where the tags were set after
        monkeypatch.setattr(type(c), name, gone_right_after_the_upload(getattr(type(c), name)))
    model = SimpleNamespace(log_model=log_model)
    log = lambda: champion.log_champion(uri, run_id, model, lambda: None, "/ckpt", "e", {"auc": 0.9},  # noqa: E731
                                        step=9, job_id="j1")
    with pytest.raises(ConnectionError):
        log()
    assert log().version == 1 and log().version == 1
    assert logged == [{"hyperband.job_id": "j1", "hyperband.resource": "9"}]  # logged once, born with the tags
    assert cut == ["get_metric_history"]  # nothing set the tags after: they came with the model


def test_the_jobs_metrics_written_again_at_its_end_are_logged_once_per_step(tmp_path, monkeypatch):
    """MLflow went away between the job's metrics and its run's end: --resume writes the end again and logs no
    second point; a job resumed with a looser criterion that trained more logs its new figures at its new step."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    job = SimpleNamespace(tracking_uri=uri, parent_run_id=c.create_run(c.create_experiment("e")).info.run_id)
    metrics = {"best_val_auc": 0.9, "default_val_auc": None, "wall_seconds": 12.0}
    end = lambda wall, step: record._finish_job_run(job, {**metrics, "wall_seconds": wall}, {}, {}, "t", step)  # noqa: E731
    end(12.0, 22)
    end(30.0, 22)  # the resume, later
    end(50.0, 40)  # trained further
    assert [(m.step, m.value) for m in c.get_metric_history(job.parent_run_id, "wall_seconds")] == [(22, 12.0), (40, 50.0)]
    assert len(c.get_metric_history(job.parent_run_id, "best_val_auc")) == 2
    assert c.get_run(job.parent_run_id).info.status == "FINISHED"


def test_a_tracking_server_out_of_database_connections_is_named_once_with_its_setting(monkeypatch):
    """MLflow's server answers a write it could not get a pooled connection for with SQLAlchemy's QueuePool timeout
    (as a 400, after 30 s): the write is tried again as any, and the process says once what the server needs."""
    import logging

    monkeypatch.setattr(record, "_pool_said", threading.Event())
    answers = iter([RuntimeError("BAD_REQUEST: QueuePool limit of size 5 overflow 10 reached, connection timed out, "
                                 "timeout 30.00 (Background on this error at: https://sqlalche.me/e/21/3o7r)"), "ok",
                    RuntimeError("BAD_REQUEST: QueuePool limit of size 5 overflow 10 reached"), "ok again"])

    def write():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    heard: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = heard.append  # type: ignore[method-assign]
    logger = logging.getLogger("prefect_hyperband.tasks.record")
    logger.addHandler(handler)
    try:
        assert record.retrying(write, delays=(0.0,)) == "ok"
        assert record.retrying(write, delays=(0.0,)) == "ok again"
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in heard if "database pool is exhausted" in r.getMessage()]
    assert len(said) == 1 and "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=40" in said[0] and "QueuePool limit" in said[0]
    assert "\n" not in said[0]


def test_a_remote_trial_rungs_worker_is_the_trial_runs_hyperband_worker_tag_in_its_one_write(tmp_path):
    """A trial-rung a task worker or a work pool's flow run trained: its result names the machine and process
    (``work_pool.result_of``); the trial's run is tagged with it in the same ``log_batch`` as its metrics."""
    from mlflow import MlflowClient

    from prefect_hyperband.flows.work_pool import outcome_of

    trained, _, _, _, _ = outcome_of({"trained": {"checkpoint": "ck", "resource": 3, "resource_trained": 3,
                                                  "seconds": 1.5, "workers": 1}, "evaluated": None, "error": None,
                                      "started": None, "ended": None, "host": "gpu-7", "pid": 4242})
    assert trained.info == {"worker": "gpu-7:4242"}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"))
    job = SimpleNamespace(tracking_uri=uri, metric_key="val_loss")
    from prefect_hyperband.hyperband.trial import TrialRung
    from prefect_hyperband.tasks.result import Outcome
    from prefect_hyperband.trainers.base import Evaluation

    rung = TrialRung(trial_id="s0-0000", bracket=0, rung=1, resource=3, config={}, checkpoint=None)
    record.log_trial_rung(job, run.info.run_id, Outcome(rung, trained, Evaluation(0.25, 0.1), None))
    data = client.get_run(run.info.run_id).data
    assert data.tags["hyperband.worker"] == "gpu-7:4242" and data.metrics["val_loss"] == 0.25
    assert "worker" not in data.metrics
