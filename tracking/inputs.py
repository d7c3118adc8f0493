"""The job's MLflow input, checked before any training: the registered model's name, the runs a job names, and
where a local store is (``sqlite:///mlflow.db`` is relative to the folder the job was started from)."""

from __future__ import annotations

import os

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.tracking.store import client

SQLITE = "sqlite:///"


#: tracking URIs that name no path though they have no scheme (MLflow's Databricks and Unity Catalog stores)
_NAMES = ("databricks", "databricks-uc", "uc")


def absolute(uri: str) -> str:
    """``uri`` with a local store's path made absolute (a SQLite file, a folder of MLflow's file store, plain or
    ``file:``), so that the same store is found from another folder, and by MLflow, which keeps one store per URI
    string in a process; a server's or a database's URI as it is."""
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/"):
        path, sep, query = uri[len(SQLITE):].partition("?")
        return f"{SQLITE}{os.path.abspath(path)}{sep}{query}" if path and path != ":memory:" else uri
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.abspath(uri[len("file:"):])
    if ":" not in uri and uri not in _NAMES:
        return os.path.abspath(uri)
    return uri


def check_model_name(name: str) -> None:
    """The experiment's name is the registered model's too: one MLflow would refuse only after the whole job."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name  # MLflow's own rule (pinned)

    try:
        _validate_model_name(name)
    except MlflowException as exc:
        raise InputError(f"--experiment {name!r} also names the registered model: {exc.message.rstrip('.')}; "
                         "choose another --experiment, or --no-register-model") from None


def check_run(uri: str, run_id: str, missing: str) -> None:
    """The run ``run_id`` is in the store at ``uri``; else ``missing``, one line (``InputError``)."""
    from mlflow.exceptions import MlflowException

    try:
        client(uri).get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise InputError(missing) from None
