"""How long MLflow's client retries a server that does not answer: ``--service-wait``, set while a job runs.

MLflow's HTTP client retries a 5xx or a lost connection itself, silently, with urllib3's backoff, as many times as
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` says: one variable per process, read at each request.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

#: MLflow's own ceiling on ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (``_MLFLOW_HTTP_REQUEST_MAX_RETRIES_LIMIT``)
MAX_CLIENT_RETRIES = 10
#: what a job set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` to (a value of the user's own is never replaced)
_RETRIES_SET = "HYPERBAND_SET_MLFLOW_RETRIES"


def client_wait(retries: int, factor: float) -> float:
    """Seconds MLflow's HTTP client waits in all over ``retries`` retries of a server error or a lost connection:
    urllib3's backoff, none before the first retry, then ``factor`` x 2^k, at most 120 s each (jitter left out)."""
    return sum(min(120.0, factor * 2 ** k) for k in range(1, retries))


#: the ``--service-wait`` of each job running in this process (``bound_client_waits``), and what the variables
#: held before the first of them began
_BOUNDS: list[float] = []
_BEFORE: dict[str, str | None] = {}
_BOUNDS_LOCK = threading.Lock()
_RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"


@contextlib.contextmanager
def bound_client_waits(service_wait: float) -> Iterator[float]:
    """``--service-wait`` for MLflow too, while a job runs: its client retries a server error or a lost connection
    for about that long (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``: the fewest retries whose backoff covers it, at most
    MLflow's 10, about 10 minutes at its backoff factor of 2), then the write fails and the job stops (exit 75,
    ``--resume``). A value the user set themselves is kept. Jobs side by side in one process: the longest bound
    of those running (MLflow reads one variable per process); after the last, the variables are as they were
    (``hb.tune`` leaves its caller's environment alone). Yields the seconds the client now waits, at most."""
    with _BOUNDS_LOCK:
        if not _BOUNDS:
            _BEFORE.update({name: os.environ.get(name) for name in (_RETRIES, _RETRIES_SET)})
        _set_client_retries(max([*_BOUNDS, service_wait]))  # first: if it raises, nothing is left half-counted
        _BOUNDS.append(service_wait)
    try:
        yield client_waits()
    finally:
        with _BOUNDS_LOCK:
            _BOUNDS.remove(service_wait)
            if _BOUNDS:
                _set_client_retries(max(_BOUNDS))
            else:
                ours = os.environ.get(_RETRIES) == os.environ.get(_RETRIES_SET)  # else changed meanwhile: kept
                for name, value in _BEFORE.items():
                    if name == _RETRIES and not ours:
                        continue
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


def _set_client_retries(service_wait: float) -> None:
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR

    factor = float(MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get())
    if os.environ.get(_RETRIES) in (None, os.environ.get(_RETRIES_SET)):  # not the user's own
        retries = next((n for n in range(1, MAX_CLIENT_RETRIES + 1) if client_wait(n, factor) >= service_wait),
                       MAX_CLIENT_RETRIES)
        os.environ[_RETRIES] = os.environ[_RETRIES_SET] = str(retries)


def client_waits() -> float:
    """Seconds MLflow's client now retries a server error or a lost connection, at most (its settings)."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR, MLFLOW_HTTP_REQUEST_MAX_RETRIES

    return client_wait(int(MLFLOW_HTTP_REQUEST_MAX_RETRIES.get()), float(MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get()))
