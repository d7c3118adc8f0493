"""``--external-memory``: a table in parts trained from disk through XGBoost's ``ExtMemQuantileDMatrix``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import data, external_memory, tables
from prefect_hyperband.trainers.layout import read_batches, read_part
from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer


def _table(folder, rows: int = 3000, parts: int = 3, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(parts):
        x = rng.normal(size=(rows // parts, 4)).astype(np.float32)
        frame = pd.DataFrame(x, columns=["a", "b", "c", "d"])
        frame["color"] = rng.choice(["red", "blue", "green"] if i else ["red", "blue"], rows // parts)
        signal = x[:, 0] * x[:, 1] + (frame["color"] == "red") - 0.5 * x[:, 2] ** 2
        frame["label"] = (signal + rng.normal(scale=0.5, size=len(frame)) > 0).astype(float)
        frame.loc[::97, "label"] = np.nan  # rows without a target are left out, as everywhere
        frame.to_parquet(folder / f"part-{i}.parquet", index=False, row_group_size=250)
    return str(folder)


def _trainer(where: str, external: bool) -> XGBoostTrainer:
    data._load_cached.cache_clear()
    return XGBoostTrainer(data.DataSpec(data=where, target="label"), seed=3, rounds_per_unit=5, milestones=(1, 3),
                          nthread=1, external_memory=external)


def test_a_part_read_in_batches_gives_read_parts_rows_and_split(tmp_path):
    where = _table(tmp_path / "t")
    table = tables.find(where)
    layout = data.layout_of(data.DataSpec(data=where, target="label"))
    for part in table.parts:
        whole = read_part(table, part, layout, 0, 0.2)
        batches = list(read_batches(table, part, layout, 0, 0.2, rows=128))
        assert len(batches) > 3  # several record batches
        for k in range(4):
            assert np.array_equal(np.concatenate([b[k] for b in batches]), whole[k])


def test_external_memory_trains_resumes_and_scores_as_the_table_in_memory(tmp_path):
    where = _table(tmp_path / "t")
    disk, memory = _trainer(where, True), _trainer(where, False)
    assert disk.external_memory and not memory.external_memory
    config = {"max_depth": 3, "eta": 0.3}
    disk.train(config, 1, None, str(tmp_path / "d1.ubj"))
    resumed = disk.train(config, 3, str(tmp_path / "d1.ubj"), str(tmp_path / "d3.ubj"))
    assert resumed.resource_trained == 2
    once = disk.train(config, 3, None, str(tmp_path / "d3once.ubj"))
    assert once.resource == 3
    memory.train(config, 3, None, str(tmp_path / "m3.ubj"))
    folder = disk._extmem.folder
    assert sorted(p.name for p in folder.glob("validation-*.npy")) == [f"validation-{i:05d}.npy" for i in range(3)]
    # the validation rows are the table's own (by their keys), whichever way it trains
    assert np.array_equal(disk._extmem.y_val, memory.data.y_val)
    scores = {name: t.measure(str(tmp_path / name))[0]
              for name, t in (("d3.ubj", disk), ("d3once.ubj", disk), ("m3.ubj", memory))}
    assert scores["d3.ubj"] == pytest.approx(scores["d3once.ubj"], abs=1e-12)  # resume = at once
    assert scores["d3.ubj"] == pytest.approx(scores["m3.ubj"], abs=0.01) and scores["d3.ubj"] > 0.7
    disk.close()
    assert not folder.exists()  # the cache on disk goes with the trainer


def test_external_memory_needs_a_table_in_parts_on_this_machine(tmp_path):
    with pytest.raises(InputError, match="read whole"):
        XGBoostTrainer(data.DataSpec(data="breast-cancer"), external_memory=True)
    where = _table(tmp_path / "t", rows=300)
    with pytest.raises(InputError, match="without Dask"):
        XGBoostTrainer(data.DataSpec(data=where, target="label"), workers=2, external_memory=True,
                       placement=lambda trainer: object())
    from prefect_hyperband.flows.params import TuneParams

    with pytest.raises(ValueError, match="external_memory trains on this machine without Dask"):
        TuneParams(data=where, target="label", workers=2, external_memory=True)
    with pytest.raises(ValueError, match="digits is read whole"):
        TuneParams(data="digits", external_memory=True)
    assert TuneParams(data=where, target="label", external_memory=True).trial_concurrency() == 1


def test_a_table_bigger_than_its_share_of_memory_trains_from_disk_by_itself(tmp_path, monkeypatch, caplog):
    where = _table(tmp_path / "t", rows=300)
    table = tables.find(where)
    monkeypatch.setattr(external_memory, "AUTO_SHARE", table.size / 2 / __import__("psutil").virtual_memory().total)
    with caplog.at_level("WARNING"):
        assert external_memory.chosen(table, False)
    assert "trained from disk (XGBoost's external memory)" in caplog.text
    monkeypatch.setattr(external_memory, "AUTO_SHARE", 0.5)
    assert not external_memory.chosen(table, False) and external_memory.chosen(table, True)


def test_a_bad_part_met_while_streaming_is_one_line_naming_it(tmp_path):
    where = _table(tmp_path / "t", rows=300)
    trainer = _trainer(where, True)
    (tmp_path / "t" / "part-2.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    with pytest.raises(InputError, match=r"part-2\.parquet"):
        trainer.train({"max_depth": 2}, 1, None, str(tmp_path / "m.ubj"))
    trainer.close()
