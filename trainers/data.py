"""Data sets: the bundled ones by name, a CSV file, or a table in parts (``trainers.tables``: CSV or Parquet files,
a folder or a glob, local or on object storage); a seeded train/validation split, stratified for a CSV file and the
bundled sets, by the rows' keys for a table in parts.

Features are encoded once, here, to a float32 matrix (categoricals one-hot with the
categories of the whole file, so train and validation share columns); trainers and the
registered model see numbers only.
"""

from __future__ import annotations

import csv
import gzip
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from prefect_hyperband.common.errors import InputError, first_line
from prefect_hyperband.trainers import tables
from prefect_hyperband.trainers.layout import DEFAULT_METRIC, MAX_CLASSES, check_sides, layout, read_part, read_table

#: the bundled UCI bank-marketing file, package data of ``prefect_hyperband.data`` (see its PROVENANCE.md)
BANK_MARKETING = ("bank-marketing", "bank-additional-full.csv.gz")
BUILTIN = tables.BUILTIN

Task = Literal["binary", "multiclass", "regression"]
#: the metrics a model scores on a data set: name -> direction; "max" metrics are better when larger.
DATA_METRICS: dict[str, Literal["max", "min"]] = {
    "auc": "max",
    "accuracy": "max",
    "rmse": "min",
    "logloss": "min",
}
#: every built-in metric, the synthetic objective's too
METRICS: dict[str, Literal["max", "min"]] = {**DATA_METRICS, "loss": "min"}


@dataclass(frozen=True)
class DataSpec:
    """What a task passes around instead of a data frame: enough to load the same split anywhere."""

    data: str = "bank-marketing"
    target: str | None = None
    drop: tuple[str, ...] | None = None  # None: the data set's default (bank-marketing drops `duration`)
    validation_fraction: float = 0.2
    seed: int = 0


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded, encoded, split data set."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    feature_names: list[str]
    task: Task
    classes: list[str] = field(default_factory=list)
    target: str = "y"
    image_shape: tuple[int, int, int] | None = None  # (channels, height, width) for image data

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def default_metric(self) -> str:
        return DEFAULT_METRIC[self.task]


def metric_direction(metric: str) -> Literal["max", "min"]:
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return METRICS[metric]


class TrainingRows:
    """A trainer's data (a mix-in; the trainer's constructor calls ``_rows_of``): ``spec``; ``info``, what a job needs
    to know of it (task, classes, feature names: a table in parts' ``Layout``, no row read in this process; else the
    data set itself); ``_table``, a table in parts (``tables.Table``, listed once here), which ranks or Dask workers
    read themselves (None: data read whole); and ``data``, every row, loaded here at first use."""

    def _rows_of(self, spec: DataSpec) -> None:
        self.spec = spec
        self._table = table_of(spec)
        self.info: Any = layout_of(spec, self._table)
        self._data: Dataset | None = None

    @property
    def data(self) -> Dataset:
        """Every row, in this process (loaded at first use: a table in parts on ranks or Dask workers never is)."""
        if self._data is None:
            self._data = load(self.spec)
        return self._data

    def example(self, n: int = 5) -> np.ndarray:
        """A few validation rows, encoded (a registered model's input example): of a table's first 1,000 rows only,
        unless all of them are loaded here already."""
        if self._table is None or self._data is not None:
            return self.data.X_val[:n]
        return example_rows(self.spec, self._table, n)


def check_metric(ds: Dataset, metric: str) -> None:
    """A metric that fits the target: AUC for binary, accuracy/logloss for classes, RMSE for numbers."""
    if metric not in DATA_METRICS:
        raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(DATA_METRICS)}")
    if ds.task == "regression" and metric != "rmse":
        raise InputError(f"metric {metric!r} needs a classification target; {ds.target!r} is numeric (use rmse)")
    if ds.task != "regression" and metric == "rmse":
        raise InputError(f"metric 'rmse' needs a numeric target; {ds.target!r} has classes")
    if ds.task == "multiclass" and metric == "auc":
        raise InputError("metric 'auc' needs a binary target; use accuracy or logloss for multi-class")


def score(metric: str, y_true: np.ndarray, prediction: np.ndarray) -> float:
    """The validation metric from labels and predictions (probabilities for classification)."""
    from sklearn import metrics as skm

    if metric == "auc":
        p = prediction[:, 1] if prediction.ndim == 2 else prediction
        return _auc(np.asarray(y_true), np.asarray(p)) if _binary01(y_true) else float(skm.roc_auc_score(y_true, p))
    if metric == "accuracy":
        labels = prediction.argmax(axis=1) if prediction.ndim == 2 else (prediction > 0.5).astype(int)
        return float(skm.accuracy_score(y_true, labels))
    if metric == "rmse":
        return float(math.sqrt(skm.mean_squared_error(y_true, prediction)))
    if metric == "logloss":
        return float(skm.log_loss(y_true, prediction, labels=np.unique(y_true)))
    raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(DATA_METRICS)}")


def _binary01(y: np.ndarray) -> bool:
    y = np.asarray(y)
    return y.ndim == 1 and y.size > 0 and bool(np.isin(y, (0, 1)).all()) and 0 < int((y == 1).sum()) < y.size


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    """ROC AUC of 0/1 labels as the Mann-Whitney statistic (ties share their average rank): the value
    ``sklearn.metrics.roc_auc_score`` computes, at ~0.5 ms instead of ~4 ms for 8,000 rows (measured),
    and every trial-rung evaluates it once."""
    order = np.argsort(p, kind="mergesort")
    _, inverse, counts = np.unique(p[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = np.empty(len(p))
    ranks[order] = ((ends - counts + ends + 1) / 2.0)[inverse]
    positive = y == 1
    n_pos = int(positive.sum())
    n_neg = len(y) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def load(spec: DataSpec) -> Dataset:
    """Load and split the data named by ``spec`` (cached per process: loaded once per job; a table in parts once per
    listing, so that a resume whose data changed reads it again)."""
    if spec.data not in BUILTIN and tables.in_parts(spec.data):
        return _load_table(spec, tables.find(spec.data))
    return _load_cached(spec)


@lru_cache(maxsize=4)
def _load_table(spec: DataSpec, table: Any) -> Dataset:  # per listing: a resume whose data changed reads it again
    _check_fraction(spec)
    return _from_table(spec, table)


def _check_fraction(spec: DataSpec) -> None:
    if not 0.0 < spec.validation_fraction < 1.0:
        raise InputError(f"validation fraction must be in (0, 1), got {spec.validation_fraction}")


@lru_cache(maxsize=8)
def _load_cached(spec: DataSpec) -> Dataset:
    _check_fraction(spec)
    if spec.data in ("digits", "breast-cancer") and spec.target not in (None, "target"):
        raise InputError(f"--target {spec.target}: {spec.data} has its own target; drop --target")
    if spec.data == "digits":
        return _from_sklearn("digits", spec, image_shape=(1, 8, 8))
    if spec.data == "breast-cancer":
        return _from_sklearn("breast-cancer", spec)
    if spec.data == "bank-marketing":
        with resources.as_file(resources.files("prefect_hyperband.data").joinpath(*BANK_MARKETING)) as path:
            frame, target = read_csv(path), spec.target or "y"
        drop = ("duration",) if spec.drop is None else spec.drop
    else:
        path = Path(spec.data)
        if not path.is_file():
            raise InputError(f"data {spec.data!r} not found; give a CSV or Parquet file, a folder or a glob of them "
                             f"(local or a URL such as s3://bucket/table/), or one of {', '.join(BUILTIN)}")
        if not spec.target:
            raise InputError(f"--target is required with a CSV file ({spec.data})")
        frame, target, drop = read_csv(path), spec.target, spec.drop or ()
    return _from_frame(frame, target, drop, spec)


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV file, comma or semicolon separated, optionally gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="") as fh:
            head = fh.read(64 * 1024)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    if not head.strip():
        raise InputError(f"data file {path} is empty")
    try:
        sep = csv.Sniffer().sniff(head.splitlines()[0], delimiters=",;").delimiter
    except csv.Error:
        sep = ","
    try:
        frame = pd.read_csv(path, sep=sep, compression="infer")
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot parse {path} as CSV: {str(exc).splitlines()[0]}") from exc
    if frame.shape[1] < 2 or len(frame) < 10:
        raise InputError(f"{path} needs at least 2 columns and 10 rows, got {frame.shape[1]} x {len(frame)}")
    return frame


def table_of(spec: DataSpec) -> Any:
    """The table in parts ``spec`` names (``tables.Table``, from its listing), or None for data read whole."""
    return tables.find(spec.data) if spec.data not in BUILTIN and tables.in_parts(spec.data) else None


def example_rows(spec: DataSpec, table: Any, n: int) -> np.ndarray:
    """``n`` encoded rows of a table's first 1,000 (validation rows where there are any): a registered model's input
    example, or the rows a model's prediction is timed on, without reading the table."""

    X_train, _, X_val, _ = read_part(table, table.parts[0], layout_of(spec, table), spec.seed, spec.validation_fraction,
                                     limit=max(n, 1000))
    return (X_val if len(X_val) else X_train)[:n]


#: ``layout_of``'s table not given: it lists the data itself
_UNLISTED: Any = object()


def layout_of(spec: DataSpec, table: Any = _UNLISTED) -> Any:
    """What a job needs to know of its data before any trial (task, classes, target, feature names, default metric):
    a table in parts' ``Layout``, from its schemas and the columns it needs, never its whole rows; else the data
    set itself. ``table``: what ``table_of(spec)`` gave, where the caller listed it already (None: data read whole)."""
    table = table_of(spec) if table is _UNLISTED else table
    return load(spec) if table is None else _layout(spec, table)


@lru_cache(maxsize=8)
def _layout(spec: DataSpec, table: Any) -> Any:  # per listing: a resume whose data changed sees the new one
    if not spec.target:
        raise InputError(f"--target is required with a table ({spec.data})")
    return layout(table, spec.target, spec.drop or ())


def _from_table(spec: DataSpec, table: Any) -> Dataset:
    """A table in parts (``trainers.tables``, listed once by ``load``), read top to bottom: its layout from its
    schemas and the columns it needs (``layout.layout``), then every part read and encoded by it (``layout.read_table``,
    as a Dask worker reads its own), its rows split by their key (part and row number), not shuffled."""
    shape = _layout(spec, table)
    X_train, y_train, X_val, y_val = read_table(table, shape, spec.seed, spec.validation_fraction)
    if len(y_train) + len(y_val) < 10:
        raise InputError(f"{spec.data} needs at least 10 rows, got {len(y_train) + len(y_val)}")
    check_sides(y_train, y_val, shape.task, len(shape.classes), shape.target, spec.validation_fraction)
    return Dataset(X_train, y_train, X_val, y_val, shape.feature_names, shape.task, list(shape.classes), shape.target)


def _from_frame(frame: pd.DataFrame, target: str, drop: tuple[str, ...], spec: DataSpec) -> Dataset:
    if target not in frame.columns:
        raise InputError(f"target column {target!r} not in the data; columns are: {', '.join(map(str, frame.columns))}")
    missing = [c for c in drop if c not in frame.columns]
    if missing:
        raise InputError(f"cannot drop unknown column(s) {', '.join(missing)}")
    frame = frame.dropna(subset=[target])
    y_raw = frame[target]
    features = frame.drop(columns=[target, *drop])
    task = _infer_task(y_raw)
    if task == "regression":
        y, classes = y_raw.to_numpy(dtype=np.float32), []
        if not np.isfinite(y).all():
            raise InputError(f"target column {target!r} has {int((~np.isfinite(y)).sum())} infinite value(s) (or "
                             "values too large for float32); fix or drop those rows")
        if np.unique(y).size < 2:
            raise InputError(f"target column {target!r} has a single value; nothing to learn")
    else:
        codes, uniques = pd.factorize(y_raw.astype(str), sort=True)
        if len(uniques) < 2:
            raise InputError(f"target column {target!r} has a single value; nothing to learn")
        y, classes = codes.astype(np.int64), [str(u) for u in uniques]
    X, names = _encode(features)
    infinite = np.isinf(X).any(axis=0)
    if infinite.any():
        raise InputError(f"column {names[int(np.argmax(infinite))]!r} has infinite values (or values too large for "
                         "float32); fix them, or leave them empty (missing)")
    return _split(X, y, names, task, classes, target, spec)


def _infer_task(y: pd.Series) -> Task:
    n_unique = y.nunique()
    if not pd.api.types.is_numeric_dtype(y) or pd.api.types.is_bool_dtype(y):
        return "binary" if n_unique == 2 else "multiclass"
    if n_unique == 2:
        return "binary"
    values = y.to_numpy(dtype=float)
    if n_unique <= MAX_CLASSES and np.all(values == np.round(values)):
        return "multiclass"
    return "regression"


def _encode(features: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Numbers as they are; other columns (categoricals) one-hot, missing as its own column."""
    categorical = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    encoded = pd.get_dummies(features, columns=categorical, dummy_na=False, dtype=np.float32)
    encoded.columns = [str(c) for c in encoded.columns]
    return encoded.to_numpy(dtype=np.float32), list(encoded.columns)


def _split(X, y, names, task: Task, classes, target: str, spec: DataSpec, image_shape=None) -> Dataset:
    from sklearn.model_selection import train_test_split

    stratify = y if task != "regression" else None
    try:
        X_train, X_val, y_train, y_val = train_test_split(
            X, y, test_size=spec.validation_fraction, random_state=spec.seed, stratify=stratify
        )
    except ValueError as exc:  # too few rows of a class for a split keeping every class on both sides
        raise InputError(f"cannot split target {target!r} into training and validation rows with every class on both "
                         f"sides ({len(y)} rows, {len(classes)} classes, validation fraction "
                         f"{spec.validation_fraction:g}): {first_line(exc)}") from None
    return Dataset(X_train, y_train, X_val, y_val, names, task, classes, target, image_shape)


def _from_sklearn(name: str, spec: DataSpec, image_shape=None) -> Dataset:
    from sklearn import datasets

    bunch = datasets.load_digits() if name == "digits" else datasets.load_breast_cancer()
    X = bunch.data.astype(np.float32)
    if name == "digits":
        X = X / 16.0  # pixel intensities 0..16 -> 0..1
    y = bunch.target.astype(np.int64)
    names = [str(n) for n in getattr(bunch, "feature_names", [f"x{i}" for i in range(X.shape[1])])]
    classes = [str(c) for c in bunch.target_names]
    task: Task = "binary" if len(classes) == 2 else "multiclass"
    return _split(X, y, names, task, classes, "target", spec, image_shape)


def describe(ds: Dataset) -> str:
    return (
        f"{len(ds.y_train)} train / {len(ds.y_val)} validation rows, {len(ds.feature_names)} features, "
        f"{ds.task}{f' ({ds.n_classes} classes)' if ds.classes else ''}"
    )


__all__ = ["BUILTIN", "DataSpec", "Dataset", "check_metric", "describe", "layout_of", "load", "metric_direction", "read_csv",
           "score"]
