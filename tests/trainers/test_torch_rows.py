"""A torch rank's own share of a table read in parts: every row in exactly one share, each rank reading its share
itself, the metric and the standardisation agreed over every share, never the controller reading the table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from prefect_hyperband.trainers import data, tables
from prefect_hyperband.trainers.torch import rows as torch_rows
from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG


def _table(folder, parts: int = 3, rows: int = 400):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(parts):
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        frame = pd.DataFrame(x, columns=list("abcd"))
        frame["label"] = (x[:, 0] * x[:, 1] + x[:, 2] > 0).astype(int)
        frame.to_parquet(folder / f"part-{i}.parquet", index=False)
    return data.DataSpec(str(folder), target="label")


@pytest.mark.parametrize("part_rows, world", [([7], 1), ([7], 3), ([64, 36], 2), ([5, 0, 9, 2], 3), ([3, 3], 5),
                                              ([10, 10, 10, 10], 4)])
def test_every_row_is_on_exactly_one_rank_and_the_shares_differ_by_a_row_at_most(part_rows, world):
    shares = [torch_rows.owned(part_rows, rank, world) for rank in range(world)]
    taken = [(p, r) for share in shares for p, start, stop in share for r in range(start, stop)]
    assert sorted(taken) == [(p, r) for p, n in enumerate(part_rows) for r in range(n)]
    sizes = [sum(stop - start for _, start, stop in share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


def test_the_ranks_shares_are_the_whole_tables_split_and_a_share_is_read_once(tmp_path):
    spec = _table(tmp_path / "t", parts=2, rows=301)
    whole = data.load(spec)
    meta = torch_rows.table_meta(tables.find(spec.data), data.layout_of(spec), spec.seed, spec.validation_fraction)
    shares = [torch_rows.read_share(meta, rank, 3) for rank in range(3)]
    for i, side in enumerate((whole.X_train, whole.y_train, whole.X_val, whole.y_val)):
        together = np.concatenate([s[i] for s in shares])
        assert len(together) == len(side)
        assert sorted(map(tuple, together.reshape(len(side), -1))) == sorted(map(tuple, side.reshape(len(side), -1)))
    reads = torch_rows._LAST["reads"]
    assert torch_rows.read_share(meta, 2, 3) is shares[2] and torch_rows._LAST["reads"] == reads  # kept
    assert torch_rows.Arrays(meta, 0, 3).shared and len(torch_rows.Arrays(meta, 0, 3).y_train) == len(shares[0][1])


@pytest.mark.slow  # real DDP ranks
def test_two_ranks_train_on_their_shares_and_agree_with_every_row_scored_in_one_place(tmp_path):
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer, predict

    spec = _table(tmp_path / "t")
    trainer = TorchTrainer(spec, workers=2, warm=False, threads_per_rank=1)
    first = trainer.train(DEFAULT_CONFIG, 2, None, str(tmp_path / "a.pt"))
    resumed = trainer.train(DEFAULT_CONFIG, 4, first.checkpoint, str(tmp_path / "b.pt"))
    value, latency = trainer.measure(resumed.checkpoint)
    assert trainer._data is None  # the controller read the table's listing and schema, never its rows
    assert [h["step"] for h in resumed.history] == [3, 4] and latency["predict_ms"] > 0
    whole = data.load(spec)  # now, for the check: every validation row scored here
    assert first.info["train_rows"] == resumed.info["train_rows"] == len(whole.y_train)  # each row on one rank
    assert value == pytest.approx(data.score("auc", whole.y_val, predict(resumed.checkpoint, whole.X_val)), abs=1e-12)
    assert value == resumed.history[-1]["val_auc"] > 0.9
    mean = torch.load(first.checkpoint, weights_only=True)["standardisation"]["mean"].numpy()
    assert np.allclose(mean, whole.X_train.mean(axis=0), atol=1e-5)  # agreed over both shares
    assert trainer.example(3).shape == (3, 4)


@pytest.mark.slow  # real scheduler and worker processes
def test_on_dask_each_worker_reads_its_share_once_for_the_whole_job(tmp_path):
    from dask.distributed import Client
    from dask_cluster import cluster  # tests/dask_cluster.py

    from prefect_hyperband.executors.dask_ranks import torch_on
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    spec = _table(tmp_path / "t")
    with cluster(["127.0.0.1", "127.0.0.2"], str(tmp_path)) as c:
        trainer = TorchTrainer(spec, workers=2, threads_per_rank=1, placement=torch_on(c.address))
        try:
            first = trainer.train(DEFAULT_CONFIG, 1, None, str(tmp_path / "a.pt"))
            trainer.train(DEFAULT_CONFIG, 2, first.checkpoint, str(tmp_path / "b.pt"))
            trainer.train({**DEFAULT_CONFIG, "lr": 0.01}, 1, None, str(tmp_path / "c.pt"))
            with Client(c.address) as client:
                held = client.run(lambda: (torch_rows._LAST["key"][1:], torch_rows._LAST["reads"]))
        finally:
            trainer.close()
    assert sorted(held.values()) == [((0, 2), 1), ((1, 2), 1)]  # three trial-rungs, one read per worker
    assert trainer._data is None
