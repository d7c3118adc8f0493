"""Ending the trials' MLflow runs: against a tracking server several at once, each run's writes in order."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tasks import record, tracking


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


def test_against_a_tracking_server_runs_end_several_at_once_each_in_order(calls):
    job = SimpleNamespace(tracking_uri="http://127.0.0.1:5000")
    record.close_trial_runs(job, _trials(20), {f"s0-{i:04d}": f"run-{i}" for i in range(20)})
    assert sorted(r for w, r, _ in calls if w == "end") == sorted(f"run-{i}" for i in range(20))
    for i in range(20):  # a run's tags before its end
        mine = [w for w, r, _ in calls if r == f"run-{i}"]
        assert mine == ["tags", "end"]
    assert ("end", "run-3", "FAILED") in calls


def test_a_local_store_ends_them_one_by_one_and_a_trial_with_no_run_is_skipped(calls):
    job = SimpleNamespace(tracking_uri="sqlite:///x.db")
    record.close_trial_runs(job, _trials(4), {"s0-0000": "run-0", "s0-0002": "run-2"})
    assert [(w, r) for w, r, _ in calls] == [("tags", "run-0"), ("end", "run-0"), ("tags", "run-2"), ("end", "run-2")]


def test_a_run_that_cannot_be_ended_past_its_retries_fails_the_call(monkeypatch, calls):
    def refuse(uri, run_id, status):
        if run_id == "run-5":
            raise ConnectionError("gone")

    monkeypatch.setattr(tracking, "end_run", refuse)
    monkeypatch.setattr(record.retrying, "__kwdefaults__", {"delays": (), "within": None})  # no waits between tries here
    with pytest.raises(ConnectionError, match="gone"):
        record.close_trial_runs(SimpleNamespace(tracking_uri="https://mlflow"), _trials(8),
                                {f"s0-{i:04d}": f"run-{i}" for i in range(8)})


def test_a_champion_registered_before_the_jobs_end_was_cut_short_is_not_registered_again(monkeypatch):
    """MLflow went away after the champion's registration and before the summary: --resume writes the end again
    and finds the version on the parent run, for the same best run; another best run is registered."""
    from prefect_hyperband.tasks import champion

    tags = {"hyperband.best_run_id": "run-7", "hyperband.champion_version": "3"}
    fake = SimpleNamespace(get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(tags=tags)))
    monkeypatch.setattr(tracking, "client", lambda uri: fake)
    registered = []
    monkeypatch.setattr(champion, "log_champion", lambda *a, **k: registered.append(a[1]) or 4)
    monkeypatch.setattr(tracking, "set_tags", lambda uri, run_id, t: tags.update(t))
    job = SimpleNamespace(parent_run_id="parent", tracking_uri="http://mlflow:5000", experiment="e",
                          settings=SimpleNamespace(model="synthetic", data=None))
    tags["hyperband.champion_resource"] = "9"
    assert record._register_champion(job, "run-7", "/ckpt", None, 9) == 3 and registered == []
    monkeypatch.setattr(record.factory, "get", lambda settings: None)
    # the same trial, trained further since (a resume with a looser criterion): its model now, registered
    assert record._register_champion(job, "run-7", "/ckpt", None, 27) == 4 and registered == ["run-7"]
    assert record._register_champion(job, "run-8", "/ckpt", None, 27) == 4 and registered == ["run-7", "run-8"]
    assert tags == {"hyperband.best_run_id": "run-8", "hyperband.champion_version": 4,
                    "hyperband.champion_resource": 27}
