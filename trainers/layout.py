"""How a table in parts becomes numbers, agreed once for the whole table (``Layout``), and each part encoded by it
alone (``read_part``): on one machine part after part, on a Dask group's workers each its own parts, after a
resume the same way.

The layout is a reduction over the parts that reads only the columns it needs (the target and the non-numeric
features; Parquet by column, a CSV part whole): the target's task and classes, the categories of every categorical
feature. Features are numbers as they are, then each categorical one-hot over its sorted categories (as
``pandas.get_dummies`` orders them for a CSV file read whole); a category a part lacks is a column of zeros there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefect_hyperband.common.errors import InputError, first_line
from prefect_hyperband.trainers.tables import Part, Table, part_url, read_part_csv, schema, validation_rows

#: integer targets with at most this many distinct values are classes, not numbers
MAX_CLASSES = 20
#: the metric a task is scored by unless ``--metric`` says otherwise
DEFAULT_METRIC = {"binary": "auc", "multiclass": "accuracy", "regression": "rmse"}


@dataclass(frozen=True)
class Layout:
    """The target's task and classes, the numeric features, and each categorical feature with its categories."""

    target: str
    task: Literal["binary", "multiclass", "regression"]
    classes: tuple[str, ...]
    numeric: tuple[str, ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]
    rows: int | None = None  # every row, when the parts' metadata say (Parquet), else None
    part_rows: tuple[int, ...] | None = None  # each part's rows, in the table's order (counted as the layout is read)

    @property
    def feature_names(self) -> list[str]:
        return [*self.numeric, *(f"{c}_{v}" for c, values in self.categorical for v in values)]

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def default_metric(self) -> str:
        return DEFAULT_METRIC[self.task]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "task": self.task, "classes": list(self.classes), "numeric": list(self.numeric),
                "categorical": [[c, list(v)] for c, v in self.categorical], "rows": self.rows,
                "part_rows": list(self.part_rows) if self.part_rows is not None else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        return cls(d["target"], d["task"], tuple(d["classes"]), tuple(d["numeric"]),
                   tuple((c, tuple(v)) for c, v in d["categorical"]), d.get("rows"),
                   tuple(d["part_rows"]) if d.get("part_rows") is not None else None)


def layout(table: Table, target: str, drop: tuple[str, ...] = ()) -> Layout:
    """The table's layout, from its schema and the target and non-numeric columns of every part (``InputError``
    naming a missing column, or a part whose values cannot be used)."""
    columns = schema(table)
    if target not in columns:
        raise InputError(f"target column {target!r} not in the data; columns are: {', '.join(columns)}")
    if len(columns) < 2:
        raise InputError(f"{table.url} needs at least 2 columns, got {len(columns)}")
    missing = [c for c in drop if c not in columns]
    if missing:
        raise InputError(f"cannot drop unknown column(s) {', '.join(missing)}")
    features = [c for c in columns if c != target and c not in drop]
    fs = table.filesystem()
    kinds = _kinds(fs, table, features + [target])
    text = [c for c in features if kinds[c] == "text"]
    seen: dict[str, set[str]] = {c: set() for c in text}
    values: set[Any] = set()
    many, counts = False, []
    for part in table.parts:
        frame = _read(fs, table, part, [*text, target])
        counts.append(len(frame))
        for c in text:
            seen[c].update(frame[c].dropna().astype(str).unique())
        if not many:
            values.update(frame[target].dropna().unique().tolist())
            many = len(values) > MAX_CLASSES
    task = _task(kinds[target], values, many)
    if not values:
        raise InputError(f"target column {target!r} has no value in {table.url}")
    classes = () if task == "regression" else tuple(sorted(_label(v) for v in values))
    if (task != "regression" and len(classes) < 2) or (task == "regression" and len(values) < 2):
        raise InputError(f"target column {target!r} has a single value; nothing to learn")
    numeric = tuple(c for c in features if kinds[c] != "text")
    return Layout(target, task, classes, numeric, tuple((c, tuple(sorted(seen[c]))) for c in text), sum(counts),
                  tuple(counts))


def _kinds(fs: Any, table: Table, columns: list[str]) -> dict[str, str]:
    """Each column: ``number``, ``bool`` or ``text``, from Parquet's schema or the first CSV part's first rows."""
    import pandas as pd

    if table.format == "parquet":
        with fs.open(table.parts[0].path, "rb") as fh:
            schema = pq.read_schema(fh)
        kinds = {}
        for c in columns:
            t = schema.field(c).type
            kinds[c] = "bool" if pa.types.is_boolean(t) else "number" if (
                pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)) else "text"
        return kinds

    sample = read_part_csv(fs, table.parts[0].path, nrows=10_000)
    return {c: "bool" if pd.api.types.is_bool_dtype(sample[c]) else
            "number" if pd.api.types.is_numeric_dtype(sample[c]) else "text" for c in columns}


def _task(kind: str, values: set[Any], many: bool) -> Literal["binary", "multiclass", "regression"]:
    """As ``data._infer_task`` decides for a frame read whole."""
    if kind != "number":
        return "binary" if len(values) == 2 else "multiclass"
    if len(values) == 2:
        return "binary"
    if not many and all(float(v) == round(float(v)) for v in values):
        return "multiclass"
    return "regression"


def _label(value: Any) -> str:
    """A class's name: an integral number without its ``.0`` (a part with a missing target reads its ints as floats)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _read(fs: Any, table: Table, part: Part, columns: list[str] | None = None, limit: int | None = None) -> Any:
    """A part's ``columns`` (all: None), its first ``limit`` rows only when given."""
    try:
        if table.format == "parquet":
            with fs.open(part.path, "rb") as fh:
                if limit is None:
                    return pq.read_table(fh, columns=columns).to_pandas()
                batch = next(pq.ParquetFile(fh).iter_batches(batch_size=limit, columns=columns), None)
                return (batch.to_pandas() if batch is not None else
                        pq.read_schema(fh).empty_table().select(columns or []).to_pandas())
        frame = read_part_csv(fs, part.path, nrows=limit)
        return frame if columns is None else frame[columns]
    except Exception as exc:  # noqa: BLE001  (an object that cannot be read: named in one line)
        raise InputError(f"cannot read {part_url(table, part)}: {type(exc).__name__}: {first_line(exc)}") from None


def read_part(table: Table, part: Part, layout: Layout, seed: int, fraction: float, limit: int | None = None,
              rows: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One part's rows (its first ``limit`` only, when given: a sample; its rows ``start:stop`` only, ``rows``)
    encoded by ``layout`` and split by their keys: ``X_train, y_train, X_val, y_val``. Runs wherever the part is
    read: this process, or a Dask worker."""
    frame = _read(table.filesystem(), table, part, _columns(layout), limit)
    validation = validation_rows([(table.name(part), len(frame))], seed, fraction)
    if rows is not None:  # keyed by their number in the whole part, as when the part is read whole
        frame, validation = frame.iloc[rows[0]:rows[1]], validation[rows[0]:rows[1]]
    return _split(frame, validation, table, part, layout)


def read_table(table: Table, layout: Layout, seed: int, fraction: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every part of ``table`` read and encoded by ``layout`` (``read_part``), in the table's order, joined:
    ``(X_train, y_train, X_val, y_val)``."""
    pieces = [read_part(table, part, layout, seed, fraction) for part in table.parts]
    return tuple(np.concatenate([p[i] for p in pieces]) for i in range(4))  # type: ignore[return-value]


def check_sides(y_train: np.ndarray, y_val: np.ndarray, task: str, n_classes: int, target: str, fraction: float) -> None:
    """Training and validation rows, with every class on both sides: else one line."""
    sides = [np.unique(side).size for side in (y_train, y_val)] if task != "regression" else [n_classes] * 2
    if not len(y_val) or not len(y_train) or min(sides) < n_classes:
        raise InputError(f"cannot split target {target!r} into training and validation rows with every class on both "
                         f"sides ({len(y_train)} training and {len(y_val)} validation rows by the rows' keys, "
                         f"{n_classes} classes, validation fraction {fraction:g})")


def read_batches(table: Table, part: Part, layout: Layout, seed: int, fraction: float, rows: int = 1 << 17
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``read_part``'s rows in batches of about ``rows`` (a Parquet part, by Arrow's record batches; a CSV part in
    one): the same rows, keys and split, a part's memory never held in several copies at once."""
    if table.format != "parquet":
        yield read_part(table, part, layout, seed, fraction)
        return

    fs = table.filesystem()
    try:
        with fs.open(part.path, "rb") as fh:
            source = pq.ParquetFile(fh)
            validation = validation_rows([(table.name(part), source.metadata.num_rows)], seed, fraction)
            done = 0
            for batch in source.iter_batches(batch_size=rows, columns=_columns(layout)):
                frame = batch.to_pandas()
                yield _split(frame, validation[done:done + len(frame)], table, part, layout)
                done += len(frame)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001  (an object that cannot be read: named in one line)
        raise InputError(f"cannot read {part_url(table, part)}: {type(exc).__name__}: {first_line(exc)}") from None


def _columns(layout: Layout) -> list[str]:
    return [*layout.numeric, *(c for c, _ in layout.categorical), layout.target]


def _split(frame: Any, validation: np.ndarray, table: Table, part: Part, layout: Layout
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``frame``'s rows with a target, encoded, split into training and validation rows by ``validation``."""
    keep = frame[layout.target].notna().to_numpy()
    if not keep.all():
        frame, validation = frame[keep], validation[keep]
    try:
        X = encode(frame, layout)
    except (ValueError, TypeError) as exc:  # text in a column the first part's rows showed as numbers (CSV)
        raise InputError(f"{part_url(table, part)}: {first_line(exc)}; every part's column needs the type it has in the "
                         "first part") from None
    bad = np.isinf(X).any(axis=0)
    if bad.any():
        raise InputError(f"{part_url(table, part)}: column {layout.feature_names[int(np.argmax(bad))]!r} has infinite "
                         "values (or values too large for float32); fix them, or leave them empty (missing)")
    y = _target(frame[layout.target], layout, part_url(table, part))
    return X[~validation], y[~validation], X[validation], y[validation]


def encode(frame: Any, layout: Layout) -> np.ndarray:
    """The feature matrix (float32) of ``frame``'s rows: the numbers, then each categorical one-hot."""
    import pandas as pd

    blocks = [frame[list(layout.numeric)].to_numpy(dtype=np.float32)] if layout.numeric else []
    for column, categories in layout.categorical:
        codes = pd.Categorical(frame[column].astype(str).where(frame[column].notna()), categories=categories).codes
        onehot = np.zeros((len(frame), len(categories)), dtype=np.float32)
        present = codes >= 0
        onehot[np.nonzero(present)[0], codes[present]] = 1.0
        blocks.append(onehot)
    return np.hstack(blocks) if blocks else np.zeros((len(frame), 0), dtype=np.float32)


def _target(values: Any, layout: Layout, where: str) -> np.ndarray:
    import pandas as pd

    if layout.task == "regression":
        y = values.to_numpy(dtype=np.float32)
        if not np.isfinite(y).all():
            raise InputError(f"{where}: target column {layout.target!r} has infinite value(s) (or values too large "
                             "for float32); fix or drop those rows")
        return y
    codes = pd.Categorical([_label(v) for v in values], categories=list(layout.classes)).codes
    return codes.astype(np.int64)
