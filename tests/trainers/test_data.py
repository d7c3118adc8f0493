from __future__ import annotations

import gzip

import numpy as np
import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.data import DataSpec, check_metric, load, read_csv


def test_bundled_bank_marketing_drops_duration_and_splits_stratified():
    ds = load(DataSpec())
    assert ds.task == "binary" and ds.classes == ["no", "yes"] and ds.default_metric == "auc"
    assert len(ds.y_train) + len(ds.y_val) == 41188
    assert not any(name.startswith("duration") for name in ds.feature_names)
    assert "job_admin." in ds.feature_names  # categoricals one-hot
    assert abs(ds.y_train.mean() - ds.y_val.mean()) < 0.002  # stratified
    assert ds.X_train.dtype == np.float32


def test_split_is_seeded():
    a, b, c = load(DataSpec("breast-cancer", seed=1)), load(DataSpec("breast-cancer", seed=1)), load(DataSpec("breast-cancer", seed=2))
    assert np.array_equal(a.y_val, b.y_val) and np.array_equal(a.X_val, b.X_val)
    assert not np.array_equal(a.X_val, c.X_val)


def write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def rows(n, sep):
    out = [sep.join(["num", "colour", "label", "value"])]
    for i in range(n):
        out.append(sep.join([str(i % 7), ["red", "blue", "green"][i % 3], ["a", "b", "c"][i % 3] if i % 5 else "a", f"{i * 0.37:.3f}"]))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("sep, gz", [(",", False), (";", False), (";", True)])
def test_any_csv_comma_or_semicolon_optionally_gzipped(tmp_path, sep, gz):
    path = write(tmp_path / ("d.csv.gz" if gz else "d.csv"), rows(60, sep), gz)
    ds = load(DataSpec(str(path), target="label"))
    assert ds.task == "multiclass" and ds.classes == ["a", "b", "c"] and ds.default_metric == "accuracy"
    assert {"colour_red", "colour_blue", "colour_green", "num", "value"} == set(ds.feature_names)
    reg = load(DataSpec(str(path), target="value"))
    assert reg.task == "regression" and reg.default_metric == "rmse"
    assert read_csv(path).shape == (60, 4)


def test_bad_data_files_and_targets_name_the_problem(tmp_path):
    with pytest.raises(InputError, match="data 'missing.csv' not found"):
        load(DataSpec("missing.csv", target="y"))
    path = write(tmp_path / "d.csv", rows(30, ","))
    with pytest.raises(InputError, match="target column 'nope' not in the data; columns are: num, colour, label, value"):
        load(DataSpec(str(path), target="nope"))
    with pytest.raises(InputError, match="--target is required"):
        load(DataSpec(str(path)))
    empty = write(tmp_path / "e.csv", "")
    with pytest.raises(InputError, match="is empty"):
        load(DataSpec(str(empty), target="x"))


def test_metric_must_fit_the_target():
    ds = load(DataSpec("digits"))
    with pytest.raises(InputError, match="'auc' needs a binary target"):
        check_metric(ds, "auc")
    with pytest.raises(InputError, match="unknown metric 'f1'"):
        check_metric(ds, "f1")
    check_metric(ds, "accuracy")


def test_auc_equals_sklearn_with_ties_and_float32():
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from prefect_hyperband.trainers.data import score

    rng = np.random.default_rng(3)
    for _ in range(20):
        y = rng.integers(0, 2, 2000)
        p = np.round(rng.random(2000), int(rng.integers(1, 5))).astype(np.float32)  # many ties
        assert score("auc", y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    two_column = np.stack([1 - p, p], axis=1)
    assert score("auc", y, two_column) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
