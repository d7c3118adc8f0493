"""The MLflow tracking store: its URI, a client of it with a SQLite store created, migrated and tuned once (per
store, across threads and processes), its writers taking turns, and a tracking server's reachability checked before
any training. The runs and what is logged to them: ``tracking.runs``."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

from prefect_hyperband.common.errors import InputError, first_line
from prefect_hyperband.common.files import file_lock

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


F = TypeVar("F", bound=Callable[..., Any])
#: per SQLite store (its URI): its writers take turns (re-entrant: start_parent calls log_params), and its first
#: opening (creation, pragmas) runs once. Per store, not per process: a writer stuck on one store (another test's,
#: another job's) never holds up a job on another
_locks: dict[tuple[str, str], threading.RLock] = {}
_locks_lock = threading.Lock()


def store_lock(kind: str, uri: str) -> threading.RLock:
    with _locks_lock:
        return _locks.setdefault((kind, uri), threading.RLock())


def one_writer(fn: F) -> F:
    """SQLite has one writer at a time: brackets logging from several threads take turns in-process,
    instead of failing with "database is locked" and retrying. Servers (http URIs) are not serialised."""

    @functools.wraps(fn)
    def wrapper(uri: str, *args: Any, **kwargs: Any) -> Any:
        if uri.startswith("sqlite:"):
            with store_lock("write", uri):
                return fn(uri, *args, **kwargs)
        return fn(uri, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def tracking_uri(explicit: str | None = None) -> str:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


#: MLflow 3's UI opens an experiment's pages in its GenAI view unless a link names the model-training one
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def on_server(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (http or https) whose UI a link can open."""
    return uri.startswith(("http://", "https://"))


def serve_command(uri: str) -> str:
    """How to see a local store in MLflow's UI, in its model-training view."""
    return f"mlflow server --backend-store-uri {uri}, then the experiment's page with ?{MODEL_TRAINING_VIEW}"


def run_page(uri: str, run_id: str, experiment_id: str | None = None) -> str:
    """The run's page in MLflow's model-training view on a tracking server (``uri`` itself when its experiment cannot
    be read); for a local store, ``serve_command``."""
    if not on_server(uri):
        return serve_command(uri)
    if experiment_id is None:
        try:
            experiment_id = client(uri).get_run(run_id).info.experiment_id
        except Exception:  # noqa: BLE001  (a link is a courtesy: the job is done)
            return uri
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"


def version_page(uri: str, name: str, version: int | str) -> str | None:
    """A registered model version's page on a tracking server (model-training view); None for a local store."""
    if not on_server(uri):
        return None
    return f"{uri.rstrip('/')}/#/models/{quote(name, safe='')}/versions/{version}?{MODEL_TRAINING_VIEW}"


def client(uri: str):
    from mlflow import MlflowClient

    # MLflow prints "View run ... at: URL" to stdout each time a run ends against a tracking server: a line per
    # trial (thousands under ASHA) on the job's terminal; the CLI prints the parent run's link once, at the end
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if uri.startswith("sqlite:") and uri not in _tuned:
        with store_lock("open", uri):
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
