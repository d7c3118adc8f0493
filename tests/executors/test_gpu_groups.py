"""A Dask cluster's GPU workers (issue 76): a group whose every worker was started with ``--resources GPU=1``
trains on its GPUs (a rank holds its worker's GPU; XGBoost's ``device`` is ``cuda``); any other group as before."""

from __future__ import annotations

from types import SimpleNamespace

from prefect_hyperband.executors import dask_groups, dask_xgboost


def test_a_group_of_gpu_workers_holds_their_gpus_and_any_other_group_does_not(monkeypatch):
    listed = {"tcp://127.0.0.1:1": {"resources": {"GPU": 1}}, "tcp://127.0.0.2:1": {"resources": {"GPU": 2.0}},
              "tcp://127.0.0.3:1": {"resources": {}}, "tcp://127.0.0.4:1": {}}
    looks: list[None] = []
    monkeypatch.setattr(dask_groups, "workers_of", lambda client: looks.append(None) or listed)
    gpus = ("tcp://127.0.0.1:1", "tcp://127.0.0.2:1")
    assert dask_groups.gpu_resources(None, gpus) == {"GPU": 1}
    assert dask_groups.gpu_resources(None, ("tcp://127.0.0.1:1", "tcp://127.0.0.3:1")) == {}  # one without: none
    assert dask_groups.gpu_resources(None, ("tcp://127.0.0.4:1",)) == {}
    assert dask_groups.gpu_resources(None, ("tcp://127.0.0.9:1",)) == {}  # gone from the scheduler's list
    placed = SimpleNamespace(worker_groups=dask_groups.WorkerGroups(None, 2))
    looks.clear()
    assert dask_xgboost.XGBoostOnDask.device(placed, gpus) == {"device": "cuda"}
    assert dask_xgboost.XGBoostOnDask.device(placed, ("tcp://127.0.0.3:1",)) == {}
    assert dask_xgboost.XGBoostOnDask.device(placed, gpus) == {"device": "cuda"} and len(looks) == 2  # once a group
