"""Shared fixtures: a temporary Prefect server for the whole session, a fresh MLflow store per test."""

from __future__ import annotations

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
os.environ.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "60")
os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")

from prefect_hyperband.flows.server import batch_server_writes  # noqa: E402

batch_server_writes()  # as the CLI's temporary server

import pytest


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for every flow test (starting one takes seconds)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    """A fresh sqlite MLflow store; artifacts land under the test's own folder."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
