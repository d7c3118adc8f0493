"""MLflow I/O with ``MlflowClient`` and explicit run ids (the fluent active run is thread-local); the store and its
client: ``tracking.store``.

Layout: one parent run per job; one nested child run per trial (tag ``mlflow.parentRunId``),
its hyperparameters as params and ``val_<metric>`` at step = cumulative resource.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from prefect_hyperband.tracking.store import client, one_writer

#: MLflow's experiment kinds (its UI opens ``custom_model_development`` in the Model training view)
KIND, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"


def experiment_id(uri: str, name: str, tags: Mapping[str, str] | None = None) -> str:
    """The experiment ``name``, created with ``tags`` when new (restored when deleted)."""
    c = client(uri)
    found = c.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            c.restore_experiment(found.experiment_id)
        return found.experiment_id
    try:
        return c.create_experiment(name, tags=dict(tags or {}))
    except Exception:  # created concurrently by another job: read it back
        found = c.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def model_development(uri: str, name: str, metric: str, greater_is_better: bool) -> tuple[str, str | None]:
    """The experiment as MLflow's model development kind with the job's primary metric, created so or, if it has no
    kind yet, tagged so (a primary metric it already names stays); one of another kind a user made is left as it is:
    (its id, a line saying so, or None)."""
    from mlflow.utils.mlflow_tags import (
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER,
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME,
    )

    primary = {MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME: metric,
               MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER: str(greater_is_better).lower()}
    wanted = {KIND: MODEL_DEVELOPMENT, **primary}
    exp_id = experiment_id(uri, name, wanted)
    c = client(uri)
    tags = c.get_experiment(exp_id).tags
    kind = tags.get(KIND)
    if kind not in (None, MODEL_DEVELOPMENT):
        return exp_id, (f"MLflow experiment {name!r} is of kind {kind!r}; left as it is (its UI may not open the "
                        "Model training view)")
    for key, value in ({KIND: MODEL_DEVELOPMENT} if kind is None else {}).items():
        c.set_experiment_tag(exp_id, key, value)
    if MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME not in tags:
        for key, value in primary.items():
            c.set_experiment_tag(exp_id, key, value)
    return exp_id, None


@one_writer
def start_parent(uri: str, experiment: str, run_name: str, params: Mapping[str, Any], tags: Mapping[str, str],
                 inputs: Sequence[Any] = ()) -> str:
    c = client(uri)
    run = c.create_run(experiment_id(uri, experiment), run_name=run_name, tags=dict(tags))
    log_params(uri, run.info.run_id, params)
    if inputs:
        c.log_inputs(run.info.run_id, datasets=list(inputs))
    return run.info.run_id


@functools.lru_cache(maxsize=64)
def _experiment_of(uri: str, parent_run_id: str) -> str:
    """The experiment of a parent run: a fact of the store, read once per process (the last 64 jobs' kept)."""
    return client(uri).get_run(parent_run_id).info.experiment_id


@one_writer
def create_child(uri: str, parent_run_id: str, run_name: str, tags: Mapping[str, str], start_time: float | None = None,
                 inputs: Sequence[Any] = ()) -> str:
    """A nested run of ``parent_run_id`` (the parent's experiment is looked up once per process), with the job's
    dataset ``inputs``."""
    c = client(uri)
    run = c.create_run(
        _experiment_of(uri, parent_run_id),
        start_time=None if start_time is None else int(start_time * 1000),
        run_name=run_name,
        tags={"mlflow.parentRunId": parent_run_id, **tags},
    )
    if inputs:
        c.log_inputs(run.info.run_id, datasets=list(inputs))
    return run.info.run_id


def _log_batches(c: Any, run_id: str, params: list[Any], metrics: list[Any], tags: list[Any] | None = None) -> None:
    """``log_batch`` within MLflow's limits: 100 params, 1000 metrics, 1000 entities per call (``tags``: the first's)."""
    tags = list(tags or [])
    while params or metrics or tags:
        p, params = params[:100], params[100:]
        m, metrics = metrics[: 1000 - len(p) - len(tags)], metrics[1000 - len(p) - len(tags) :]
        c.log_batch(run_id, params=p, metrics=m, tags=tags)
        tags = []


def existing_children(uri: str, parent_run_id: str) -> dict[str, str]:
    """trial id -> run id of the parent's child runs already created (by an earlier attempt or run of the job)."""
    c = client(uri)
    parent = c.get_run(parent_run_id)
    found: dict[str, str] = {}
    token = None
    while True:
        page = c.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=1000,
            page_token=token,
        )
        for run in page:
            trial_id = run.data.tags.get("hyperband.trial_id")
            if trial_id:
                found.setdefault(trial_id, run.info.run_id)
        token = page.token
        if not token:
            return found


@one_writer
def log_params(uri: str, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    _log_batches(client(uri), run_id, [Param(str(k), _fmt(v)) for k, v in params.items()], [])


@one_writer
def log_metrics(uri: str, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None]
    if items:
        client(uri).log_batch(run_id, metrics=items)


def result_metrics(history: Iterable[Mapping[str, float]], metrics: Mapping[str, float], step: int) -> list[Any]:
    """A trial-rung's metrics: the per-unit ``history`` (each row at its own step) and ``metrics`` at ``step``."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, int(row["step"])) for row in history for k, v in row.items() if k != "step"]
    items += [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None]
    return items


@one_writer
def log_result(
    uri: str, run_id: str, history: Iterable[Mapping[str, float]], metrics: Mapping[str, float], step: int,
    params: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None,
) -> None:
    """A trial-rung in one write, with the run's ``params`` on its first (more writes only past
    MLflow's limits: 100 params, 1000 metrics a batch) and ``tags`` set (each write's the latest)."""
    from mlflow.entities import Param, RunTag

    items = [Param(str(k), _fmt(v)) for k, v in (params or {}).items()]
    _log_batches(client(uri), run_id, items, result_metrics(history, metrics, step),
                 [RunTag(k, v) for k, v in (tags or {}).items()])


@one_writer
def log_history(uri: str, run_id: str, key: str, points: Iterable[tuple[int, float, float]]) -> None:
    """A metric's history in batches: (step, value, epoch seconds) each, so MLflow draws its curve."""
    from mlflow.entities import Metric

    items = [Metric(key, float(v), int(at * 1000), int(step)) for step, v, at in points]
    _log_batches(client(uri), run_id, [], items)


#: the run tag by which MLflow's UI shows a JSON artifact as a table (what ``MlflowClient.log_table`` sets)
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"


@one_writer
def log_table(uri: str, run_id: str, rows: list[dict[str, Any]], artifact_file: str) -> None:
    """Rows as an MLflow table artifact (the run's artifact view shows it as a table), replacing the last one.

    Not ``MlflowClient.log_table``: it appends to a table already there (it downloads it and concatenates), so
    the live importances, written every few seconds, and a resumed job's leaderboard grew a copy per write. The
    file is MLflow's own format (pandas' "split" JSON) and the tag the one it sets."""
    import pandas as pd

    target = PurePosixPath(artifact_file)
    c = client(uri)
    with tempfile.TemporaryDirectory(prefix="hyperband-table-") as tmp:
        local = os.path.join(tmp, target.name)
        pd.DataFrame(rows).to_json(local, orient="split", index=False, date_format="iso")
        c.log_artifact(run_id, local, None if str(target.parent) == "." else str(target.parent))
    shown = json.loads(c.get_run(run_id).data.tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in shown:
        c.set_tag(run_id, LOGGED_ARTIFACTS_TAG, json.dumps([*shown, entry]))


@one_writer
def log_figure(uri: str, run_id: str, figure: Any, artifact_file: str) -> None:
    client(uri).log_figure(run_id, figure, artifact_file)


@one_writer
def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, _fmt(v)) for k, v in tags.items()])


@one_writer
def set_status(uri: str, run_id: str, status: str) -> None:
    client(uri).update_run(run_id, status=status)


@one_writer
def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)


@one_writer
def log_json(uri: str, run_id: str, payload: Any, artifact_file: str) -> None:
    client(uri).log_dict(run_id, payload, artifact_file)


@one_writer
def log_artifacts(uri: str, run_id: str, path: str, artifact_path: str) -> None:
    """A file or a directory's files, under ``artifact_path`` on the run."""
    if os.path.isdir(path):
        client(uri).log_artifacts(run_id, path, artifact_path)
    else:
        client(uri).log_artifact(run_id, path, artifact_path)


@one_writer
def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    client(uri).log_text(run_id, text, artifact_file)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)[:6000]
    return str(value)[:6000]
