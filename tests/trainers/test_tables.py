"""``--data`` as a table where it lives: CSV or Parquet parts in a folder or a glob, locally or on S3 (moto)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import data, tables


def _frame(rows: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    frame = pd.DataFrame(x, columns=["a", "b", "c"])
    frame["color"] = np.where(rng.random(rows) < 0.5, "red", "blue")
    frame["label"] = (x[:, 0] + (frame["color"] == "red") > 0.5).astype(int)
    return frame


def _write(folder, frame: pd.DataFrame, kind: str = "parquet", parts: int = 3) -> list[pd.DataFrame]:
    folder.mkdir(parents=True, exist_ok=True)
    chunks = [frame.iloc[i::parts].reset_index(drop=True) for i in range(parts)]
    for i, chunk in enumerate(chunks):
        if kind == "parquet":
            chunk.to_parquet(folder / f"part-{i}.parquet", index=False)
        else:
            chunk.to_csv(folder / f"part-{i}.csv.gz", index=False)
    return chunks


def _load(where: str, seed: int = 0) -> data.Dataset:
    data._load_cached.cache_clear()
    return data.load(data.DataSpec(data=where, target="label", seed=seed))


def test_a_folder_and_a_glob_of_parquet_parts_are_one_table_split_by_the_rows_keys(tmp_path):
    chunks = _write(tmp_path / "t", _frame())
    (tmp_path / "t" / "_SUCCESS").write_text("")  # Spark's bookkeeping: not a part
    folder, glob = _load(str(tmp_path / "t")), _load(str(tmp_path / "t" / "part-*.parquet"))
    assert np.array_equal(folder.X_val, glob.X_val) and np.array_equal(folder.y_train, glob.y_train)
    assert len(folder.y_train) + len(folder.y_val) == 300 and folder.task == "binary"
    assert folder.feature_names == ["a", "b", "c", "color_blue", "color_red"]
    # the same rows are validation rows whoever reads them: each part's own mask, part by part
    masks = [tables.validation_rows([(f"part-{i}.parquet", len(c))], 0, 0.2) for i, c in enumerate(chunks)]
    expected = pd.concat([c[m] for c, m in zip(chunks, masks)])
    assert np.allclose(folder.X_val[:, :3], expected[["a", "b", "c"]].to_numpy())
    assert not np.array_equal(_load(str(tmp_path / "t"), seed=1).y_val, folder.y_val)  # seeded
    table = tables.find(str(tmp_path / "t"))
    assert [table.name(p) for p in table.parts] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    from prefect_hyperband.trainers.layout import read_part

    sample = read_part(table, table.parts[0], data.layout_of(data.DataSpec(data=str(tmp_path / "t"), target="label")),
                       0, 0.2, limit=10)  # a sample: the first rows only, split as when the part is read whole
    assert len(sample[1]) + len(sample[3]) == 10 and np.array_equal(sample[0][:3], folder.X_train[:3])


def test_a_folder_of_compressed_csv_parts_reads_the_same_rows(tmp_path):
    frame = _frame()
    _write(tmp_path / "p", frame)
    _write(tmp_path / "c", frame, kind="csv")
    parquet, csv = _load(str(tmp_path / "p")), _load(str(tmp_path / "c"))
    rows = lambda ds: np.sort(np.concatenate([ds.X_train, ds.X_val])[:, 0])  # noqa: E731
    assert np.allclose(rows(parquet), rows(csv)) and csv.feature_names == parquet.feature_names
    assert tables.find(str(tmp_path / "c")).format == "csv"


def test_an_s3_url_reads_what_the_local_folder_holds(s3, tmp_path):
    frame = _frame()
    _write(tmp_path / "t", frame)
    s3.put(str(tmp_path / "t") + "/", "bucket/table/", recursive=True)
    local, remote = _load(str(tmp_path / "t")), _load("s3://bucket/table/")
    assert np.array_equal(local.X_val, remote.X_val) and np.array_equal(local.y_train, remote.y_train)
    lineage = tables.lineage_of("s3://bucket/table/")
    assert lineage["parts"] == 3 and lineage["url"] == "s3://bucket/table/" and lineage["format"] == "parquet"
    with pytest.raises(InputError, match="not found"):
        _load("s3://bucket/nothing/")


def test_the_lineage_digest_follows_the_files_listing(tmp_path):
    _write(tmp_path / "t", _frame())
    before = tables.lineage_of(str(tmp_path / "t"))
    assert tables.lineage_of(str(tmp_path / "t")) == before and tables.lineage_of("digits") is None
    _frame(30, seed=2).to_parquet(tmp_path / "t" / "part-3.parquet", index=False)
    after = tables.lineage_of(str(tmp_path / "t"))
    assert after["parts"] == 4 and after["digest"] != before["digest"] and after["bytes"] > before["bytes"]


@pytest.mark.parametrize("case, message", [
    ("nothing", "no CSV or Parquet file matches it"),
    ("mixed", "mixes CSV and Parquet files"),
    ("schema", "part-1.parquet: its columns differ from"),
    ("target", "part-1.parquet: its columns differ from"),
    ("unreadable", "cannot read"),
    ("empty", "no CSV or Parquet file in that folder"),
])
def test_bad_tables_are_one_line_naming_the_file(tmp_path, case, message):
    frame = _frame()
    folder = tmp_path / "t"
    _write(folder, frame)
    where = str(folder)
    if case == "nothing":
        where = str(folder / "*.csv")
    elif case == "mixed":
        frame.to_csv(folder / "extra.csv", index=False)
    elif case == "schema":
        frame.rename(columns={"b": "B"}).to_parquet(folder / "part-1.parquet", index=False)
    elif case == "target":
        frame.drop(columns=["label"]).to_parquet(folder / "part-1.parquet", index=False)
    elif case == "unreadable":
        (folder / "part-1.parquet").write_bytes(b"not parquet")
    elif case == "empty":
        where = str(tmp_path / "empty")
        (tmp_path / "empty").mkdir()
    with pytest.raises(InputError) as raised:
        _load(where)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_single_csv_file_keeps_its_stratified_split(tmp_path):
    """The split of a CSV file read whole is today's (``train_test_split``, stratified, seeded): the same configs
    and scores as before; only tables read in parts are split by their rows' keys."""
    from sklearn.model_selection import train_test_split

    frame = _frame()
    frame.to_csv(tmp_path / "one.csv", index=False)
    ds = _load(str(tmp_path / "one.csv"))
    y = frame["label"].to_numpy()
    _, _, _, y_val = train_test_split(frame.index.to_numpy(), y, test_size=0.2, random_state=0, stratify=y)
    assert np.array_equal(ds.y_val, y_val) and not tables.in_parts(str(tmp_path / "one.csv"))
    assert tables.in_parts(str(tmp_path / "one.parquet")) and tables.in_parts("s3://b/one.csv")


def test_a_csv_part_whose_column_holds_text_where_the_first_holds_numbers_is_one_line(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    pd.DataFrame({"x": np.arange(50.0), "label": np.arange(50) % 2}).to_csv(folder / "a.csv", index=False)
    pd.DataFrame({"x": ["oops"] * 50, "label": np.arange(50) % 2}).to_csv(folder / "b.csv", index=False)
    with pytest.raises(InputError, match="b.csv: could not convert string to float: 'oops'; every part's column"):
        _load(str(folder))
