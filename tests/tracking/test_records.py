"""``tracking/records.py``: the trials' records in MLflow, each write retried: their runs' close (several at once
against a tracking server), a server out of database connections named once, a remote worker's tag."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tracking import records
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
    n = records.CLOSE_AT_ONCE_FROM
    records.close_trial_runs(job, _trials(n), {f"s0-{i:04d}": f"run-{i}" for i in range(n)})
    assert sorted(r for w, r, _ in calls if w == "end") == sorted(f"run-{i}" for i in range(n))
    for i in range(n):  # a run's tags before its end
        mine = [w for w, r, _ in calls if r == f"run-{i}"]
        assert mine == ["tags", "end"]
    assert ("end", "run-3", "FAILED") in calls


def test_against_a_tracking_server_a_few_runs_end_one_by_one(calls):
    """A rung's close, every few seconds of a job: many jobs share the server, and eight at once from each stalled it."""
    job = SimpleNamespace(tracking_uri="http://127.0.0.1:5000")
    n = records.CLOSE_AT_ONCE_FROM - 1
    records.close_trial_runs(job, _trials(n), {f"s0-{i:04d}": f"r-{i}" for i in range(n)})  # no run-0/1: no gate
    assert [(w, r) for w, r, _ in calls] == [(w, f"r-{i}") for i in range(n) for w in ("tags", "end")]


def test_a_local_store_ends_them_one_by_one_and_a_trial_with_no_run_is_skipped(calls):
    job = SimpleNamespace(tracking_uri="sqlite:///x.db")
    records.close_trial_runs(job, _trials(4), {"s0-0000": "run-0", "s0-0002": "run-2"})
    assert [(w, r) for w, r, _ in calls] == [("tags", "run-0"), ("end", "run-0"), ("tags", "run-2"), ("end", "run-2")]


def test_a_run_that_cannot_be_ended_past_its_retries_fails_the_call(monkeypatch, calls):
    def refuse(uri, run_id, status):
        if run_id == "r-5":
            raise ConnectionError("gone")

    monkeypatch.setattr(tracking, "end_run", refuse)
    monkeypatch.setattr(records.retrying, "__kwdefaults__", {"delays": (), "within": None})  # no waits between tries here
    for n in (8, records.CLOSE_AT_ONCE_FROM):  # one by one, and several at once
        with pytest.raises(ConnectionError, match="gone"):
            records.close_trial_runs(SimpleNamespace(tracking_uri="https://mlflow"), _trials(n),
                                    {f"s0-{i:04d}": f"r-{i}" for i in range(n)})


def test_a_tracking_server_out_of_database_connections_is_named_once_with_its_setting(monkeypatch):
    """MLflow's server answers a write it could not get a pooled connection for with SQLAlchemy's QueuePool timeout
    (as a 400, after 30 s): the write is tried again as any, and the process says once what the server needs."""
    import logging

    monkeypatch.setattr(records, "_pool_said", threading.Event())
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
    logger = logging.getLogger("prefect_hyperband.tracking.records")
    logger.addHandler(handler)
    try:
        assert records.retrying(write, delays=(0.0,)) == "ok"
        assert records.retrying(write, delays=(0.0,)) == "ok again"
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
    job = SimpleNamespace(tracking_uri=uri, metric_key="val_loss", max_resource=9)
    from prefect_hyperband.executors.result import Outcome
    from prefect_hyperband.hyperband.trial import TrialRung
    from prefect_hyperband.trainers.base import Evaluation

    rung = TrialRung(trial_id="s0-0000", bracket=0, rung=1, resource=3, config={}, checkpoint=None)
    records.log_trial_rung(job, run.info.run_id, Outcome(rung, trained, Evaluation(0.25, 0.1), None))
    data = client.get_run(run.info.run_id).data
    assert data.tags["hyperband.worker"] == "gpu-7:4242" and data.metrics["val_loss"] == 0.25
    assert "worker" not in data.metrics
