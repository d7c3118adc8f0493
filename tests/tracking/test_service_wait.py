"""MLflow's client retries bounded by --service-wait while a job runs, and put back after."""

from __future__ import annotations

import os


def test_mlflow_client_retries_are_bounded_by_service_wait_unless_the_user_set_them(monkeypatch):
    from prefect_hyperband.tracking import service_wait

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", service_wait._RETRIES_SET):
        monkeypatch.setenv(name, "0")  # recorded, so that what the job sets below is undone after the test
        monkeypatch.delenv(name)
    # urllib3's backoff at MLflow's factor 2: 0, 4, 8, 16, 32, 64, 120, 120, ... s; MLflow's default 7 retries: 244 s
    assert [service_wait.client_wait(n, 2) for n in (1, 2, 3, 7, 8, 10)] == [0, 4, 12, 244, 364, 604]
    with service_wait.bound_client_waits(300) as waits:
        assert waits == 364 and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "8"
        with service_wait.bound_client_waits(10) as waits:  # a job beside it in this process: the longer bound holds
            assert waits == 364
        with service_wait.bound_client_waits(5000) as waits:  # MLflow's ceiling: 10 retries
            assert waits == 604
        assert service_wait.client_waits() == 364  # back to the job still running
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the caller's environment as it was (hb.tune)
    assert service_wait._RETRIES_SET not in os.environ
    first, second = service_wait.bound_client_waits(300), service_wait.bound_client_waits(10)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first job ends before the second: the second's bound now
    assert service_wait.client_waits() == 12
    second.__exit__(None, None, None)
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ and service_wait._RETRIES_SET not in os.environ
    with service_wait.bound_client_waits(10) as waits:
        assert waits == 12
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # the user's own: kept, during and after
    with service_wait.bound_client_waits(300) as waits:
        assert waits == 4 and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
