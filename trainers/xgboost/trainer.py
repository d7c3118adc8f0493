"""XGBoost trials: one resource unit = ``rounds_per_unit`` boosting rounds (default 10).

Resume. A promoted trial continues from its saved booster (``xgb_model=``); it is never
retrained. XGBoost's row/column samplers keep RNG state that the saved model does not hold,
so a plain "train 3, save, resume to 9" differs from "train 9". We therefore split training
at ``milestones`` (every rung resource of the job's schedule) and seed each segment from
(job seed, segment start): a model is then a pure function of (config, resource), and
resuming equals training at once, bit for bit, with one ``xgb.train`` call per rung.

Distribution. ``workers == 1`` trains in-process (a table in parts from disk with ``external_memory``:
``trainers.external_memory``). ``workers > 1`` or ``dask_address`` trains with XGBoost's allreduce over a Dask
cluster: a LocalCluster of ``workers`` processes started once per job, or an existing scheduler at
``dask_address``; the cluster and its groups are the executor's (``executors.dask_xgboost.xgboost_on``, given by the
plug-in as ``placement``), the row partitions each group holds the trainer's (``partition``). The cluster's workers
are split into disjoint groups of ``workers`` (W // workers groups on a cluster of W), and the training rows are put
on each group once, in ``workers`` row partitions, each worker's matrix kept between trial-rungs
(``trainers.xgboost.ranks``). A trial-rung takes a free group, trains on it alone and gives it back: W // workers
trials train at once, never two on one worker (two allreduce jobs interleaved on single-threaded workers would
deadlock), each with the same partitions in the same ranks, hence the same model as one trial at a time. A group
that loses a worker mid-segment is retired and the segment runs again from the same booster on another group
(``XGBoostOnDask.run``): the same model again. The validation metric is computed here, centrally, on the whole
validation set (XGBoost's distributed AUC is a per-worker average).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import external_memory as extmem
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.base import TrainResult, checkpoint_resource, write_sidecar
from prefect_hyperband.trainers.data import (
    DataSpec,
    TrainingRows,
    check_metric,
    score,
)
from prefect_hyperband.trainers.gpus import GpuPool
from prefect_hyperband.trainers.layout import read_part
from prefect_hyperband.trainers.xgboost import ranks as xgboost_ranks
from prefect_hyperband.trainers.xgboost import tracker as xgboost_tracker
from prefect_hyperband.trainers.xgboost.config import PARAMS, ROUNDS_PER_UNIT, segments

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Objective:
    objective: str
    extra: dict[str, Any]


def _StopWhenAsked():
    """An XGBoost callback that ends training after the current round when the job is stopping."""
    import xgboost as xgb

    class StopWhenAsked(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log) -> bool:
            return stopping.requested()

    return StopWhenAsked()


class XGBoostTrainer(TrainingRows):
    """``train(config, resource, checkpoint, out)`` for XGBoost boosters; one instance per job."""

    model = "xgboost"

    def __init__(
        self,
        spec: DataSpec,
        workers: int = 1,
        metric: str | None = None,
        seed: int = 0,
        rounds_per_unit: int = ROUNDS_PER_UNIT,
        milestones: tuple[int, ...] = (),
        placement: Callable[[XGBoostTrainer], Any] | None = None,
        nthread: int | None = None,
        device: str = "cpu",
        external_memory: bool = False,
        gpus: tuple[int, ...] | None = None,
    ) -> None:
        if workers < 1:
            raise InputError(f"workers must be >= 1, got {workers}")
        if rounds_per_unit < 1:
            raise InputError(f"rounds per unit must be >= 1, got {rounds_per_unit}")
        self._rows_of(spec)  # its layout (``info``), its table in parts (``partition`` reads it on Dask), its rows
        self.seed, self.rounds_per_unit = seed, rounds_per_unit
        self.milestones = tuple(milestones)
        self._validation: tuple[Any, Any, np.ndarray] | None = None  # on the cluster: X and y; y's values here
        if external_memory and (self._table is None or placement is not None or workers > 1):
            raise InputError("external memory trains a table read in parts (Parquet, or a folder or glob of CSV or "
                             f"Parquet files) on this machine, without Dask; {spec.data!r}"
                             + (" is read whole" if self._table is None else " with workers or a Dask address"))
        #: a table trained from disk (``trainers.external_memory``): asked for, or too big for this machine's memory
        self.external_memory = (self._table is not None and placement is None and workers == 1
                                and extmem.chosen(self._table, external_memory))
        self._extmem: extmem.Matrix | None = None
        self._extmem_built = threading.Lock()  # built once, by the first trial-rung that needs it
        self._extmem_lock = threading.Lock()  # trials train on it one at a time (they stream its pages)
        self.metric = metric or self.info.default_metric
        check_metric(self.info, self.metric)
        self.nthread = nthread or max(1, (os.cpu_count() or 1))
        self.device = device
        self.gpu_pool = GpuPool(gpus if workers == 1 and placement is None else None, 1)  # a trial-rung: one, cuda:<id>
        self.objective = self._objective()
        self._key = f"hyperband-{os.getpid()}-{id(self):x}-{time.time_ns():x}"  # this trainer's, on Dask's workers
        #: this machine's training matrices not in use (``_dtrain_local``), and how many were built
        self._free: list[Any] = []
        self._free_lock = threading.Lock()
        self._lost = threading.local()  # this thread's trial-rung: worker-seconds lost to groups that lost a worker
        self.matrices_built = 0
        self.workers = workers
        #: with ``workers > 1`` or ``--dask-address``: the cluster, its client and its free groups of workers, each
        #: holding this trainer's partitions of the training rows (``executors.dask_xgboost.XGBoostOnDask``)
        self._dask = placement(self) if placement is not None else None
        if workers > 1 and self._dask is None:
            raise InputError(f"workers={workers} trains on a Dask cluster: give the trainer its placement "
                             "(executors.dask_xgboost.xgboost_on), as the xgboost plug-in does")

    # -- distribution -------------------------------------------------------------------------
    def partition(self, client: Any, group: tuple[str, ...]) -> Any:
        """The training rows on ``group``'s workers, in ``workers`` row partitions, each worker's matrix kept between
        trial-rungs (``trainers.xgboost.ranks``): the same partitions in the same ranks on every group, so the same
        model on any group. Not ``xgboost.dask.train``: its tasks wait forever on a worker that died (and hold its
        ``MultiLock`` on the group's workers meanwhile); these are watched by the placement (``gather``)."""
        client.run_on_scheduler(xgboost_tracker.warm)
        if self._table is not None:
            return self._read_on(client, group)
        return xgboost_ranks.scatter(client, f"{self._key}:{','.join(group)}", self.data.X_train, self.data.y_train,
                                     group)

    def _read_on(self, client: Any, group: tuple[str, ...]) -> Any:
        """A table's parts read by ``group``'s workers themselves (once per group and job), each encoded by the job's
        layout and split by its rows' keys, kept there for the group's matrices (``trainers.xgboost.ranks``); the
        first group also keeps the validation rows, scored where they are."""
        import dask
        import dask.array as da
        from distributed import wait

        began, first = time.perf_counter(), self._validation is None
        on = {"workers": list(group), "allow_other_workers": False, "pure": False}
        read = read_part if first else xgboost_ranks.training_part
        reads = [client.submit(read, self._table, part, self.info, self.spec.seed, self.spec.validation_fraction,
                               **on) for part in self._table.parts]
        wait(reads)
        parts = reads if not first else [client.submit(operator.itemgetter(0, 1), r, **on) for r in reads]
        if first:
            n = len(self.info.feature_names)
            ytype = np.float32 if self.info.task == "regression" else np.int64
            X_val = da.concatenate([da.from_delayed(dask.delayed(operator.getitem)(r, 2), shape=(np.nan, n),
                                                    dtype=np.float32) for r in reads])
            y_val = da.concatenate([da.from_delayed(dask.delayed(operator.getitem)(r, 3), shape=(np.nan,),
                                                    dtype=ytype) for r in reads])
            X_val, y_val = client.persist([X_val, y_val], workers=list(group), allow_other_workers=False)
            wait(parts + [X_val, y_val])
            self._validation = (X_val, y_val, y_val.compute())
            del reads
        logging.getLogger(__name__).info("group %s read the table's %d part(s) from %s in %.2f s", ",".join(group),
                                         len(self._table.parts), self._table.url, time.perf_counter() - began)
        return xgboost_ranks.rows_on(client, f"{self._key}:{','.join(group)}", parts)

    @property
    def worker_groups(self) -> Any:
        """The Dask workers' groups a trial-rung trains on (None on this machine's threads)."""
        return self._dask.worker_groups if self._dask is not None else None

    def close(self) -> None:
        """Shut down what this trainer started; an external cluster is only disconnected."""
        dask, self._dask = self._dask, None
        if dask is not None:
            with contextlib.suppress(Exception):  # the workers' matrices (an external cluster's outlive the job)
                xgboost_ranks.drop(dask.client, self._key)
            dask.close()
        matrix, self._extmem = self._extmem, None
        if matrix is not None:
            matrix.close()
        with self._free_lock:
            self._free.clear()

    # -- training -----------------------------------------------------------------------------
    def _objective(self) -> _Objective:
        if self.info.task == "binary":
            return _Objective("binary:logistic", {"eval_metric": "auc"})
        if self.info.task == "multiclass":
            return _Objective("multi:softprob", {"num_class": self.info.n_classes, "eval_metric": "mlogloss"})
        return _Objective("reg:squarederror", {"eval_metric": "rmse"})

    def params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(config) - PARAMS
        if unknown:
            raise InputError(f"unknown XGBoost parameter(s): {', '.join(sorted(unknown))}")
        return {
            **config,
            "objective": self.objective.objective,
            **self.objective.extra,
            "tree_method": "hist",
            "device": self.device,
            "nthread": self.nthread,
            "verbosity": 0,
        }

    def _external(self) -> extmem.Matrix:
        with self._extmem_built:
            if self._extmem is None:
                self._extmem = extmem.Matrix(self._table, self.info, self.spec.seed, self.spec.validation_fraction,
                                             self.nthread)
            return self._extmem

    @contextlib.contextmanager
    def _dtrain_local(self) -> Iterator[Any]:
        """A training matrix no other trial uses meanwhile: built once per trial trained at once (kept between
        trial-rungs, whichever thread runs them), or the table's external-memory matrix, one trial at a time."""
        import xgboost as xgb

        if self.external_memory:
            matrix = self._external()
            with self._extmem_lock:
                yield matrix.dtrain
            return
        with self._free_lock:
            dtrain = self._free.pop() if self._free else None
        if dtrain is None:
            dtrain = xgb.QuantileDMatrix(self.data.X_train, self.data.y_train, nthread=self.nthread)
            self.matrices_built += 1
        try:
            yield dtrain
        finally:
            with self._free_lock:
                self._free.append(dtrain)

    def _segment_seed(self, start: int) -> int:
        return (self.seed * 1_000_003 + start * 7_919) % (2**31 - 1)

    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        """Train ``config`` to ``resource`` units, continuing from ``checkpoint`` when given."""
        import xgboost as xgb

        began = time.perf_counter()
        start = checkpoint_resource(checkpoint + ".json") if checkpoint else 0
        if resource <= start:
            raise ValueError(f"resource {resource} must exceed the checkpoint's {start}")
        booster = xgb.Booster(model_file=checkpoint) if checkpoint else None
        self._lost.seconds = 0.0  # worker-seconds of attempts on Dask groups that lost a worker (``_train_dask``)
        with self.gpu_pool.lease() as gpus:
            params = {**self.params(config), **({"device": f"cuda:{gpus[0]}"} if gpus else {})}
            booster = self._segments(params, start, resource, booster)
        booster.save_model(out)
        write_sidecar(out, resource, rounds=booster.num_boosted_rounds())
        lost = self._lost.seconds
        seconds = time.perf_counter() - began - lost / self.workers
        return TrainResult(out, resource, resource - start, seconds, self.workers, model=booster,  # measure's: not loaded again
                           info={"gpus": float(len(gpus or ())), **({"lost_worker_seconds": lost} if lost else {})})

    def _segments(self, params: dict[str, Any], start: int, resource: int, booster):
        """The booster trained from ``start`` to ``resource`` units, a segment between milestones at a time."""
        import xgboost as xgb

        for a, b in segments(start, resource, self.milestones):
            seeded = {**params, "seed": self._segment_seed(a)}
            rounds = (b - a) * self.rounds_per_unit
            if self._dask is None:
                with self._dtrain_local() as dtrain:
                    booster = xgb.train(seeded, dtrain, num_boost_round=rounds, xgb_model=booster,
                                        callbacks=[_StopWhenAsked()])
                if self.external_memory:
                    extmem.give_back_freed()
            else:
                booster = self._train_dask(seeded, rounds, booster)
            stopping.check()  # a stop came mid-segment: the booster holds fewer rounds than due, save nothing
        return booster

    def _train_dask(self, params: dict[str, Any], rounds: int, booster):
        """One segment on a free group of workers (trials on one group never interleave); on another group, from the
        same booster, when its group loses a worker (``XGBoostOnDask.run``): the same rounds, the same model."""
        dask = self._dask
        if dask is None:
            raise RuntimeError("the Dask cluster of this trainer is closed (the job is stopping)")

        def on(group: tuple[str, ...], rows: xgboost_ranks.Rows) -> Any:
            seeded = {**params, "nthread": max(1, self.nthread // self.workers), **dask.device(group)}  # GPU: cuda
            return xgboost_ranks.train(dask.client, rows, seeded, rounds, booster,
                                       gather=lambda futures: dask.gather(futures, group))

        trained, lost, _ = dask.run(on)
        self._lost.seconds = getattr(self._lost, "seconds", 0.0) + lost
        return trained

    # -- evaluation ---------------------------------------------------------------------------
    def booster(self, checkpoint: str):
        import xgboost as xgb

        return xgb.Booster(model_file=checkpoint)

    def _loaded(self, checkpoint: str, model: Any = None):
        """The checkpoint's booster: ``model``, the one ``train`` returned with it, else loaded from it."""
        return model if model is not None else self.booster(checkpoint)

    def predict(self, checkpoint: str, X: np.ndarray) -> np.ndarray:
        return self._timed_predict(checkpoint, X)[0]

    def _timed_predict(self, checkpoint: str, X: np.ndarray, model: Any = None) -> tuple[np.ndarray, float]:
        """The predictions, and the seconds the loaded booster took for them."""
        booster = self._loaded(checkpoint, model)
        booster.set_param({"nthread": self.nthread, "device": self.device})  # rows here, in memory: the CPU's
        began = time.perf_counter()
        prediction = booster.inplace_predict(X)
        return prediction, time.perf_counter() - began

    def evaluate(self, checkpoint: str) -> float:
        """The validation metric on the whole validation set, computed here (not per worker)."""
        return self.measure(checkpoint)[0]

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The validation metric, and ``predict_ms``: milliseconds per 1,000 validation rows, the booster loaded (a
        table on Dask: predicted by the workers that hold its validation rows, only the predictions come here);
        ``model``: the booster ``train`` returned with the checkpoint (not loaded again)."""
        if self._validation is not None and self._dask is not None:
            from xgboost import dask as dxgb

            X_val, _, y_val = self._validation
            booster = self._loaded(checkpoint, model)
            began = time.perf_counter()
            prediction = dxgb.inplace_predict(self._dask.client, booster, X_val).compute()
            latency = {"predict_ms": (time.perf_counter() - began) * 1e6 / max(1, len(y_val))}
            return score(self.metric, y_val, np.asarray(prediction)), latency
        if self.external_memory:  # the validation rows on disk, a part at a time
            booster = self._loaded(checkpoint, model)
            booster.set_param({"nthread": self.nthread})
            matrix, began = self._external(), time.perf_counter()
            prediction = matrix.predict(booster.inplace_predict)
            latency = {"predict_ms": (time.perf_counter() - began) * 1e6 / max(1, len(matrix.y_val))}
            value = score(self.metric, matrix.y_val, prediction)
            del prediction
            extmem.give_back_freed()
            return value, latency
        prediction, seconds = self._timed_predict(checkpoint, self.data.X_val, model)
        latency = {"predict_ms": seconds * 1e6 / max(1, len(self.data.X_val))}
        return score(self.metric, self.data.y_val, prediction), latency
