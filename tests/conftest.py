"""Shared fixtures: a temporary Prefect server for the whole session, a fresh MLflow store per test."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
os.environ.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "60")
os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")
# a PREFECT_HOME of the suite's (each xdist worker its own): a developer's ~/.prefect (its database, profiles, storage)
# is never touched, and two suites on one machine (the oldest and the newest Prefect, each migrating the database to
# its own revision) share none; a test that wants another sets its own
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="hyperband-tests-prefect-home-")
atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], True)

from prefect_hyperband.flows.server import batch_server_writes  # noqa: E402

batch_server_writes()  # as the CLI's temporary server

import pytest  # noqa: E402

#: a fast test's bound, in seconds (pytest-timeout): under two spinning processes and without xdist the slowest fast
#: test takes well under it; one that would hang fails with its stack, naming itself, and the run goes on
FAST_TEST_TIMEOUT = 180


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_TIMEOUT))


@pytest.fixture(autouse=True)
def _mlflow_writer_in_a_thread(request, monkeypatch):
    """Fast tests write their trials' runs from a thread (``tracking.writer.ThreadWriter``): a writer process per
    in-process job costs seconds of imports each. Slow tests, whose jobs are real processes, keep the default
    writer (``writer_for``: a thread for a small job); ``test_trial_rung_metrics_are_written_by_the_mlflow_writer...`` checks
    the process in the fast tier."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("HYPERBAND_MLFLOW_WRITER", "thread")


class _CurrentStderr:
    """``sys.stderr`` as it is when written to: pytest gives each test a stream of its own and closes it after."""

    def __getattr__(self, name):
        return getattr(sys.stderr, name)


@pytest.fixture(autouse=True)
def _log_handlers_follow_the_tests_stderr():
    """A console log handler made during a test (Prefect's, set up by an in-process CLI job's ``JobLog``; MLflow's)
    holds that test's captured stderr; a later test's job logging through it printed "--- Logging error ---" and a
    traceback (a closed file) into its own output. After each test such a handler writes to the stderr of the moment."""
    yield
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    for handler in {h for logger in loggers for h in logger.handlers}:
        if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
            continue
        if type(handler.stream).__module__.startswith("_pytest"):
            handler.stream = _CurrentStderr()  # not setStream: it flushes the old one, closed by now
        if isinstance(handler, PrefectConsoleHandler) and type(handler.console.file).__module__.startswith("_pytest"):
            handler.console.file = _CurrentStderr()


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for every flow test (starting one takes seconds), running the app the CLI's
    temporary server runs (``flows.server.create_app``)."""
    from harness import harness  # tests/harness.py

    with harness(startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory):
    """An empty MLflow sqlite store made once: creating one runs MLflow's schema migrations (about 1.5 s here),
    which every test that wants a fresh store paid again; a copy of this file is the same fresh store (a test
    whose job runs in a subprocess copies it where the job's ``MLFLOW_TRACKING_URI`` points)."""
    import os

    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow-template")
    here = os.getcwd()
    os.chdir(folder)  # the Default experiment's artifact folder, if anything ever logs there
    try:
        MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    finally:
        os.chdir(here)
    return folder / "mlflow.db"


@pytest.fixture
def mlflow_db(tmp_path, mlflow_template) -> str:
    """A fresh sqlite MLflow store at ``tmp_path/mlflow.db`` (a copy of the session's empty one), for a job that runs
    in a subprocess; its URI."""
    import shutil

    shutil.copyfile(mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch, mlflow_template):
    """A fresh sqlite MLflow store (a copy of the session's empty one); artifacts land under the test's own folder."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copyfile(mlflow_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on loopback, its endpoint in the environment, with a bucket ``bucket``."""
    pytest.importorskip("moto")
    import os

    from moto.server import ThreadedMotoServer

    from prefect_hyperband.executors.storage import filesystem

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    from s3fs import S3FileSystem

    # fsspec keeps one S3 filesystem per set of options; one opened without an endpoint (``url_to_fs``: botocore reads
    # AWS_ENDPOINT_URL as it connects) by an earlier module held that module's stopped server (a run on Prefect 3.9.1
    # failed test_tables' S3 test on it, in an xdist worker that had run another S3 module first)
    S3FileSystem.clear_instance_cache()
    fs = filesystem("s3://bucket")
    if not fs.exists("bucket"):  # moto's backend is one per process: another module's server made it
        fs.mkdir("bucket")
    yield fs
    server.stop()
    S3FileSystem.clear_instance_cache()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
