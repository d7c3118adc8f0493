"""MLflow I/O with ``MlflowClient`` and explicit run ids (the fluent active run is thread-local).

Layout: one parent run per job; one nested child run per trial (tag ``mlflow.parentRunId``),
its hyperparameters as params and ``val_<metric>`` at step = cumulative resource.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from prefect_hyperband.common.errors import InputError, first_line
from prefect_hyperband.common.files import file_lock

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


F = TypeVar("F", bound=Callable[..., Any])
#: per SQLite store (its URI): its writers take turns (re-entrant: start_parent calls log_params), and its first
#: opening (creation, pragmas) runs once. Per store, not per process: a writer stuck on one store (another test's,
#: another job's) never holds up a job on another
_locks: dict[tuple[str, str], threading.RLock] = {}
_locks_lock = threading.Lock()


def _lock(kind: str, uri: str) -> threading.RLock:
    with _locks_lock:
        return _locks.setdefault((kind, uri), threading.RLock())


def _one_writer(fn: F) -> F:
    """SQLite has one writer at a time: brackets logging from several threads take turns in-process,
    instead of failing with "database is locked" and retrying. Servers (http URIs) are not serialised."""

    @functools.wraps(fn)
    def wrapper(uri: str, *args: Any, **kwargs: Any) -> Any:
        if uri.startswith("sqlite:"):
            with _lock("write", uri):
                return fn(uri, *args, **kwargs)
        return fn(uri, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def tracking_uri(explicit: str | None = None) -> str:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def client(uri: str):
    from mlflow import MlflowClient

    # MLflow prints "View run ... at: URL" to stdout each time a run ends against a tracking server: a line per
    # trial (thousands under ASHA) on the job's terminal; the CLI prints the parent run's link once, at the end
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if uri.startswith("sqlite:") and uri not in _tuned:
        with _lock("open", uri):
            if uri not in _tuned:
                with _creation_lock(uri):  # WAL's first switch too: it wants the database to itself
                    c = _open_stores(uri)
                    _tune_sqlite(uri, c)
                return c
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


_tuned: set[str] = set()


@contextlib.contextmanager
def _creation_lock(uri: str) -> Iterator[None]:
    """Across processes, one at a time: ``<database>.lock`` beside a SQLite file. Two jobs started together on a
    new ``mlflow.db`` would both run MLflow's schema migration on it and one would fail (``table runs already
    exists``, ``Online migration expected to match one row``)."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    with file_lock(os.path.abspath(database) + ".lock"):
        yield


def _open_stores(uri: str) -> Any:
    """A client of a SQLite URI with its tracking and registry stores open (MLflow creates and migrates a new
    database as it opens it, then caches the store per URI): under ``_creation_lock``, the second job finds it
    created."""
    from mlflow import MlflowClient

    try:
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)  # opens the tracking store
        c._get_registry_client().store  # noqa: B018  (opening is the point)
        return c
    except Exception as exc:
        raise StoreError(f"MLflow store {uri}: cannot open it: {type(exc).__name__}: {first_line(exc)}; if the file "
                         "is not an MLflow database (or one of another MLflow version), move it away or pass "
                         "--tracking-uri sqlite:///another.db") from exc


class StoreError(InputError):
    """The tracking store cannot be opened; the message names it and what to do (one line, exit 2)."""


def _tune_sqlite(uri: str, c: Any) -> None:
    """A local sqlite store in WAL mode with ``synchronous=NORMAL``: a commit appends to the log
    instead of syncing the database file twice, 2-3x faster per write (measured: a child run's
    create + params 18 -> 7.5 ms). Safe against a killed process; a power cut may lose the last
    commits, never corrupt the file. ``MLFLOW_SQLITE_WAL=0`` keeps sqlite's defaults (a database on
    a network filesystem, where WAL does not work)."""
    _tuned.add(uri)
    if os.environ.get("MLFLOW_SQLITE_WAL", "1") == "0":
        return
    try:
        from sqlalchemy import event

        engine = c._tracking_client.store.engine
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(engine, "connect", on_connect)
        engine.dispose()  # pooled connections reconnect with the pragma
    except Exception as exc:  # an older or different store: its defaults are slower, not wrong

        logging.getLogger(__name__).debug("sqlite tuning skipped for %s: %s", uri, exc)


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """Fail fast, before any training, when the tracking server cannot be reached."""
    if not uri.startswith(("http://", "https://")):
        try:
            client(uri).search_experiments(max_results=1)
        except InputError:
            raise
        except Exception as exc:
            if "://" in uri and not uri.startswith("file:"):  # a database: it may be restarting (--service-wait)
                raise
            raise InputError(f"--tracking-uri {uri}: {first_line(exc)}") from None  # a folder: MLflow's file store
        return

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).read()
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"MLflow tracking server {uri} is not reachable ({exc}); start it or pass --tracking-uri") from exc


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


@_one_writer
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


@_one_writer
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


@_one_writer
def log_params(uri: str, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    _log_batches(client(uri), run_id, [Param(str(k), _fmt(v)) for k, v in params.items()], [])


@_one_writer
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


@_one_writer
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


@_one_writer
def log_history(uri: str, run_id: str, key: str, points: Iterable[tuple[int, float, float]]) -> None:
    """A metric's history in batches: (step, value, epoch seconds) each, so MLflow draws its curve."""
    from mlflow.entities import Metric

    items = [Metric(key, float(v), int(at * 1000), int(step)) for step, v, at in points]
    _log_batches(client(uri), run_id, [], items)


#: the run tag by which MLflow's UI shows a JSON artifact as a table (what ``MlflowClient.log_table`` sets)
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"


@_one_writer
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


@_one_writer
def log_figure(uri: str, run_id: str, figure: Any, artifact_file: str) -> None:
    client(uri).log_figure(run_id, figure, artifact_file)


@_one_writer
def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, _fmt(v)) for k, v in tags.items()])


@_one_writer
def set_status(uri: str, run_id: str, status: str) -> None:
    client(uri).update_run(run_id, status=status)


@_one_writer
def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)


@_one_writer
def log_json(uri: str, run_id: str, payload: Any, artifact_file: str) -> None:
    client(uri).log_dict(run_id, payload, artifact_file)


@_one_writer
def log_artifacts(uri: str, run_id: str, path: str, artifact_path: str) -> None:
    """A file or a directory's files, under ``artifact_path`` on the run."""
    if os.path.isdir(path):
        client(uri).log_artifacts(run_id, path, artifact_path)
    else:
        client(uri).log_artifact(run_id, path, artifact_path)


@_one_writer
def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    client(uri).log_text(run_id, text, artifact_file)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)[:6000]
    return str(value)[:6000]
