"""A table in parts on a Dask cluster: each group's workers read the parts themselves, the job's process none."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from dask_cluster import cluster  # tests/dask_cluster.py

pytestmark = pytest.mark.slow


def _table(folder) -> None:
    """Three Parquet parts; the categorical column ``color`` has other categories in each part."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i, colors in enumerate((["red"], ["blue", "green"], ["red", "green"])):
        x = rng.normal(size=(120, 3)).astype(np.float32)
        color = rng.choice(colors, size=120)
        label = (x[:, 0] + (color == "red") - 0.3 > 0).astype(int)
        frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(color=color, label=label)
        frame.to_parquet(folder / f"part-{i}.parquet", index=False)


def test_two_groups_read_the_parts_themselves_and_encode_and_split_them_as_one_machine(tmp_path):
    """Two groups of one worker (hosts 127.0.0.1 and 127.0.0.2) each read the whole table from its parts: the same
    columns (every category of every part), so the same booster on either group; the validation rows the first group
    keeps are those the local trainer splits off; the job's process reads no row (its trainer's data never loaded)."""
    from prefect_hyperband.executors.dask_xgboost import xgboost_on
    from prefect_hyperband.trainers import data
    from prefect_hyperband.trainers.xgboost import ranks as xgboost_ranks
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    _table(tmp_path / "t")
    spec = data.DataSpec(data=str(tmp_path / "t"), target="label", seed=3)
    local = data.load(spec)
    data._load_table.cache_clear()
    with cluster(["127.0.0.1", "127.0.0.2"], str(tmp_path)) as c:
        trainer = XGBoostTrainer(spec, workers=1, placement=xgboost_on(c.address), nthread=1)
        try:
            client = trainer._dask.client
            params = {**trainer.params({"max_depth": 3, "eta": 0.3}), "seed": 1, "nthread": 1}
            boosters = []
            groups = [(w,) for w in sorted(client.scheduler_info()["workers"])]
            for group in groups:
                rows = trainer.partition(client, group)
                assert list(rows.by_worker) == list(group)
                boosters.append(xgboost_ranks.train(client, rows, params, 5, None))
            # a trial-rung continues on the matrix its group's worker built at the first: 5 + 5 rounds = 10 at once
            more = xgboost_ranks.train(client, rows, params, 5, boosters[-1])
            once = xgboost_ranks.train(client, rows, params, 10, None)
            assert np.array_equal(more.inplace_predict(local.X_val), once.inplace_predict(local.X_val))
            kept = client.run(lambda: sorted(xgboost_ranks._matrices))
            assert sorted(len(keys) for keys in kept.values()) == [1, 1]  # one matrix per worker, built once
            X_val, _, y_val = trainer._validation
            assert np.array_equal(y_val, local.y_val)
            assert np.allclose(X_val.compute(), local.X_val)
            assert trainer.info.feature_names == local.feature_names == [
                "a", "b", "c", "color_blue", "color_green", "color_red"]
            predictions = [b.inplace_predict(local.X_val) for b in boosters]
            assert np.allclose(predictions[0], predictions[1])
            score, latency = trainer.measure(_saved(boosters[0], tmp_path))
            assert score == pytest.approx(data.score("auc", local.y_val, predictions[0]))
            assert latency["predict_ms"] > 0
            assert trainer._data is None and data._load_table.cache_info().currsize == 0  # no row read here
            dask = trainer._dask
            trainer.close()
            assert dask is not None
        finally:
            trainer.close()
        with __import__("distributed").Client(c.address) as client:  # the job's end: the workers' matrices dropped
            assert all(not keys for keys in client.run(lambda: list(xgboost_ranks._matrices)).values())


def _saved(booster, tmp_path) -> str:
    path = str(tmp_path / "model.ubj")
    booster.save_model(path)
    return path
