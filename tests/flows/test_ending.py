"""The job's end cut short: one line that names the service that did not answer, and a Cancelled state."""

from __future__ import annotations

import errno
import logging
from types import SimpleNamespace

import httpx
import pytest
import requests

from prefect_hyperband.flows import ending
from prefect_hyperband.tasks import record

JOB = SimpleNamespace(job_id="j1", tracking_uri="http://127.0.0.1:5999")


def _end_raising(monkeypatch, exc: BaseException):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(ending, "_finish", fail)
    return ending.finish(SimpleNamespace(service_wait=30.0), JOB, [], None, {}, 0, None, logging.getLogger("t"))


def _wrapped(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as e:
            raise outer from e
    except Exception as e:
        return e


def test_mlflow_not_answering_is_said_with_its_bound(monkeypatch):
    from mlflow.exceptions import MlflowException

    state = _end_raising(monkeypatch, _wrapped(MlflowException("API request to /api/2.0/mlflow/runs/get failed"),
                                               requests.exceptions.ConnectionError("Max retries exceeded")))
    assert state.is_cancelled()
    assert state.message.startswith("job j1 stopped: MLflow did not answer within 30 s (--service-wait) while the "
                                    "job's end was written to MLflow at http://127.0.0.1:5999: ")
    assert state.message.endswith("every result is saved: --resume j1 writes its summary and model")
    from prefect.exceptions import CancelledRun

    with pytest.raises(CancelledRun, match="^job j1 stopped: "):  # what a Python caller of the flow gets
        state.result()


def test_prefects_api_not_answering_is_not_blamed_on_mlflow(monkeypatch):
    monkeypatch.setattr(record, "prefect_api", lambda: "http://127.0.0.1:4299/api")
    state = _end_raising(monkeypatch, httpx.ConnectError("All connection attempts failed"))
    assert state.is_cancelled()
    assert state.message.startswith("job j1 stopped: Prefect's API did not answer while the job's end was written "
                                    "through Prefect's API at http://127.0.0.1:4299/api: All connection attempts")
    assert "MLflow" not in state.message


def test_a_full_disk_says_to_free_space(monkeypatch):
    state = _end_raising(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert "stopped: no space left on device while" in state.message and "free space, then --resume j1" in state.message


def test_any_other_error_is_the_jobs_own(monkeypatch):
    with pytest.raises(KeyError):
        _end_raising(monkeypatch, KeyError("best"))


def test_a_job_whose_every_trial_failed_names_the_first_error_and_one_with_a_result_does_not():
    from prefect_hyperband.hyperband.scheduler import TrialRecord

    def trial(trial_id: str, status: str, error: str | None = None) -> TrialRecord:
        return TrialRecord(trial_id, 0, {"x": 0.5}, status, 0, 1, {1: None if error else 0.1}, error)

    failed = [trial("s0-0000", "failed", "ValueError: bad config handling\n  File x"), trial("s0-0001", "failed", "E")]
    assert ending._every_trial_failed(failed) == "s0-0000: ValueError: bad config handling"
    assert ending._every_trial_failed([*failed, trial("s0-0002", "completed")]) is None
    assert ending._every_trial_failed([*failed, trial("s0-0002", "stopped")]) is None
    assert ending._every_trial_failed([]) is None  # nothing ran (a job stopped before its first result)
