"""XGBoost's trial-rungs on a Dask cluster: its groups of workers (``executors.dask_groups``), each holding the
trainer's partitions of the training rows, and a trial-rung run again on another group when its group loses a
worker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prefect_hyperband.executors import dask_groups

log = logging.getLogger(__name__)


class XGBoostOnDask:
    """XGBoost's trial-rungs on a Dask cluster (``trainers.base.Placement``, given by the xgboost plug-in): the
    scheduler at ``address``, or a LocalCluster of ``trainer.workers`` processes started once per job, split into
    groups of ``trainer.workers``, each holding the trainer's partitions of the training rows
    (``trainer.partition(client, group)``). ``xgboost.dask`` trains on a group it takes from ``worker_groups``."""

    def __init__(self, trainer: Any, address: str | None) -> None:
        workers = trainer.workers
        self.cluster, self.address = None, address
        if address:
            self.client = dask_groups.connect(address, workers)
        else:
            from distributed import Client, LocalCluster

            self.cluster = LocalCluster(n_workers=workers, threads_per_worker=max(1, trainer.nthread // workers),
                                        processes=True, host="127.0.0.1", dashboard_address=None,
                                        silence_logs=logging.ERROR)
            self.client = Client(self.cluster)
        self.client.wait_for_workers(workers, timeout=120)
        self.worker_groups = dask_groups.WorkerGroups(self.client, workers,
                                                      lambda group: trainer.partition(self.client, group))

    def run(self, fn: Callable[[tuple[str, ...], Any], Any],
            retries: int = dask_groups.RETRIES) -> tuple[Any, float, int]:
        """``fn(group, data)`` on a free group (its tasks waited for with ``gather``, which raises ``GroupLost``);
        when the group loses a worker it is retired (its other workers regroup with those that join, each new
        group loading its data again) and ``fn`` runs again on another group, ``retries`` times, then the
        trial-rung fails naming each loss. Returns (what ``fn`` returned, worker-seconds lost, attempts). A
        scheduler lost for good stops the job (``stop_if_unreachable``) rather than failing its trials."""
        try:
            return self._run(fn, retries)
        except Exception:
            if self.address:
                dask_groups.stop_if_unreachable(self.client, self.address)
            raise

    def _run(self, fn: Callable[[tuple[str, ...], Any], Any], retries: int) -> tuple[Any, float, int]:
        lost, reasons = 0.0, []
        while True:
            with self.worker_groups.take() as (group, data):
                if dask_groups.gone_of(self.client, group):  # lost while free: no work lost, no attempt spent
                    self.worker_groups.retire(group)
                    continue
                began = time.monotonic()
                try:
                    return fn(group, data), lost, len(reasons) + 1
                except dask_groups.GroupLost as exc:
                    lost += (time.monotonic() - began) * len(group)
                    reasons.append(str(exc))
                    log.warning("%s: the trial-rung's training runs again on another group", exc)
                    self.worker_groups.retire(group)
                    if len(reasons) > retries:
                        raise RuntimeError(f"the trial-rung lost its Dask group {len(reasons)} times: "
                                           + "; ".join(reasons)) from exc

    def gather(self, futures: list, group: tuple[str, ...]) -> list[Any]:
        """``gather`` on this cluster: the results of a trial-rung's tasks on ``group``, or ``GroupLost``."""
        return dask_groups.gather(self.client, futures, group)

    def device(self, group: tuple[str, ...]) -> dict[str, str]:
        """XGBoost's ``device`` on ``group``: ``cuda`` (each worker's first visible GPU) where every worker of it was
        started with ``--resources GPU=1``, else the CPU's default."""
        return {"device": "cuda"} if self.worker_groups.gpus(group) else {}

    def close(self) -> None:
        """Shut down what it started; an external cluster is only disconnected."""
        self.worker_groups.close()
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def xgboost_on(address: str | None) -> Callable[[Any], XGBoostOnDask]:
    """XGBoost's placement: the cluster at ``address``, or a LocalCluster of the trainer's ``workers`` (None)."""
    return lambda trainer: XGBoostOnDask(trainer, address)
