"""``tasks/record.py``: the writes of the job's end (a champion registered once, found again over REST, a model logged
born tagged, the job's metrics once per step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefect_hyperband.tasks import record
from prefect_hyperband.tracking import runs as tracking


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
