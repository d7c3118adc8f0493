"""XGBoost's allreduce on a group of Dask workers, each worker's training matrix kept between trial-rungs.

``xgboost.dask.train`` builds every worker's ``QuantileDMatrix`` from its partitions again in each call (the
quantile sketch an allreduce over the group, then the gradient index): measured 2.5 s per call on 100 MB over two
workers and 22.1 s on 1 GB (``benchmarks/bench_big_data.py``), where a Hyperband job calls it once per trial-rung.
Here each worker builds its matrix at its group's first trial-rung and keeps it, in the worker's process
(``_matrices``, by the group's key), until the job drops it (``drop``): a trial-rung's call is a tracker's start and
one task per worker. The collective is XGBoost's own, as ``xgboost.dask`` runs it: a ``RabitTracker`` on the Dask
scheduler, each worker inside ``xgboost.dask.CommunicatorContext``, its parts passed as futures (no row moves).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefect_hyperband.trainers.layout import read_part

#: in a Dask worker's process only: the training matrices of the groups it belongs to, by key
_matrices: dict[str, Any] = {}


@dataclass(frozen=True)
class Rows:
    """A group's training rows where they live: each worker's parts (futures of ``(X, y)``), and the key its workers
    keep their matrix under."""

    key: str
    by_worker: dict[str, tuple[Any, ...]]


def rows_on(client: Any, key: str, parts: list[Any]) -> Rows:
    """``parts`` (futures of ``(X, y)``, each held by one worker of the group) grouped by the worker that holds it."""
    held = client.who_has(parts)
    by_worker: dict[str, list[Any]] = {}
    for future in parts:
        by_worker.setdefault(sorted(held[future.key])[0], []).append(future)
    return Rows(key, {worker: tuple(futures) for worker, futures in sorted(by_worker.items())})


def train(client: Any, rows: Rows, params: dict[str, Any], rounds: int, booster: Any) -> Any:
    """``rounds`` more boosting rounds of ``booster`` (None: a new one) over the group's rows: one task per worker
    holding some, in one collective; the booster every worker holds, from the first."""
    from distributed.comm import get_address_host

    workers = list(rows.by_worker)
    args = client.run_on_scheduler(_tracker, len(workers), get_address_host(client.scheduler.address))
    call = uuid.uuid4().hex[:12]
    futures = [client.submit(_rank, rows.key, parts, params, args, rounds, booster, workers=[worker],
                             allow_other_workers=False, pure=False, key=f"hyperband-xgboost-{call}-{i}")
               for i, (worker, parts) in enumerate(rows.by_worker.items())]
    results = client.gather(futures)
    return next(result for result in results if result is not None)


def training_part(table: Any, part: Any, layout: Any, seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """On a worker: a part's training rows (``trainers.layout.read_part``'s first two), its validation rows left."""
    X, y, _, _ = read_part(table, part, layout, seed, fraction)
    return X, y


def drop(client: Any, prefix: str) -> None:
    """Every worker forgets the matrices whose key starts with ``prefix`` (a job's, at its end)."""
    client.run(_drop, prefix)


def _tracker(n_workers: int, host: str) -> dict[str, Any]:
    """On the scheduler: XGBoost's tracker for one collective of ``n_workers``, waited for in a thread."""
    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(n_workers=n_workers, host_ip=host, sortby="task")
    tracker.start()
    threading.Thread(target=tracker.wait_for, daemon=True).start()
    return tracker.worker_args()


def _rank(key: str, parts: tuple[tuple[np.ndarray, np.ndarray], ...], params: dict[str, Any], args: dict[str, Any],
          rounds: int, booster: Any) -> Any:
    """On a worker: its rank of the collective; its matrix built at the first call of ``key`` (inside the
    collective: the sketch is the group's), then kept. Returns the booster on rank 0, None elsewhere."""
    import xgboost as xgb
    from xgboost import collective
    from xgboost.dask import CommunicatorContext  # ranks by worker, as xgboost.dask's own

    with CommunicatorContext(**args):
        dtrain = _matrices.get(key)
        if dtrain is None:
            X = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
            y = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
            dtrain = _matrices[key] = xgb.QuantileDMatrix(X, y, nthread=params.get("nthread"))
        trained = xgb.train(params, dtrain, num_boost_round=rounds, xgb_model=booster)
        first = collective.get_rank() == 0
    return trained if first else None


def _drop(prefix: str) -> int:
    gone = [key for key in _matrices if key.startswith(prefix)]
    for key in gone:
        del _matrices[key]
    return len(gone)
