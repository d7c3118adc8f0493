"""XGBoost's allreduce on a group of Dask workers, each worker's training matrix kept between trial-rungs.

``xgboost.dask.train`` builds every worker's ``QuantileDMatrix`` from its partitions again in each call (the
quantile sketch an allreduce over the group, then the gradient index): measured 2.5 s per call on 100 MB over two
workers and 22.1 s on 1 GB (``benchmarks/bench_big_data.py``), where a Hyperband job calls it once per trial-rung.
Here each worker builds its matrix at its group's first trial-rung and keeps it, in the worker's process
(``_matrices``, by the group's key), until the job drops it (``drop``): a trial-rung's call is a tracker's start and
one task per worker. The collective is XGBoost's own, as ``xgboost.dask`` runs it: a ``RabitTracker`` on the Dask
scheduler's machine (in a process of its own: ``tracker``), each worker inside ``xgboost.collective.CommunicatorContext``,
its parts passed as futures (no row moves).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefect_hyperband.trainers.layout import read_part
from prefect_hyperband.trainers.xgboost import tracker

#: seconds a rank's collective waits for a peer: a peer's worker lost without a reset (its machine gone) releases
#: the group's other ranks at this timeout at worst (a SIGKILLed one's closed connection, at once)
COLLECTIVE_TIMEOUT = 120

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


def scatter(client: Any, key: str, X: np.ndarray, y: np.ndarray, group: tuple[str, ...]) -> Rows:
    """In-memory training rows on ``group``'s workers: ``len(group)`` row partitions, the i-th on the worker that is
    rank i of the collective (ranks go by worker address, ``sortby="task"``), so every group holds the same
    partitions in the same ranks and trains the same model. Scattered from here (no key shared with another group:
    a group that loses a worker loses its own rows only, and the group that replaces it scatters them again)."""
    workers = sorted(group)
    rows = -(-len(y) // len(workers))
    parts = [client.scatter((X[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]), workers=[w], hash=False)
             for i, w in enumerate(workers)]
    return Rows(key, {w: (part,) for w, part in zip(workers, parts)})


def train(client: Any, rows: Rows, params: dict[str, Any], rounds: int, booster: Any,
          gather: Callable[[list], list] | None = None) -> Any:
    """``rounds`` more boosting rounds of ``booster`` (None: a new one) over the group's rows: one task per worker
    holding some, in one collective; the booster every worker holds, from the first. ``gather``: how the tasks are
    waited for (the placement's, which gives up on a group that lost a worker; ``client.gather`` by default)."""
    from distributed.comm import get_address_host

    workers = list(rows.by_worker)
    args = client.run_on_scheduler(tracker.worker_args, len(workers), get_address_host(client.scheduler.address))
    call = uuid.uuid4().hex[:12]
    futures = [client.submit(_rank, rows.key, parts, params, {**args, "DMLC_TASK_ID": f"{i:06d}"}, rounds, booster,
                             workers=[worker],
                             allow_other_workers=False, pure=False, key=f"hyperband-xgboost-{call}-{i}")
               for i, (worker, parts) in enumerate(rows.by_worker.items())]
    results = (gather or client.gather)(futures)
    return next(result for result in results if result is not None)


def training_part(table: Any, part: Any, layout: Any, seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """On a worker: a part's training rows (``trainers.layout.read_part``'s first two), its validation rows left."""
    X, y, _, _ = read_part(table, part, layout, seed, fraction)
    return X, y


def drop(client: Any, prefix: str) -> None:
    """Every worker forgets the matrices whose key starts with ``prefix`` (a job's, at its end)."""
    client.run(_drop, prefix)


def _rank(key: str, parts: tuple[tuple[np.ndarray, np.ndarray], ...], params: dict[str, Any], args: dict[str, Any],
          rounds: int, booster: Any) -> Any:
    """On a worker: its rank of the collective; its matrix built at the first call of ``key`` (inside the
    collective: the sketch is the group's), then kept. Returns the booster on rank 0, None elsewhere."""
    import xgboost as xgb
    from xgboost import collective

    # rank i is the i-th worker of ``rows.by_worker`` (its task id, ``train``), not xgboost.dask's worker name order:
    # the same partitions in the same ranks on every group
    with collective.CommunicatorContext(**args, dmlc_timeout=COLLECTIVE_TIMEOUT):
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
