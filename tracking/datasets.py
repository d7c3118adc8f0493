"""The job's training and validation data as MLflow datasets: name, digest of the content, source, schema, size.

Logged as inputs of the parent run and of every child run (contexts ``training`` and ``validation``), so two
jobs on two versions of a CSV file differ in the runs table, and the champion's metrics are linked to the
validation dataset. A user's own trainer or script reads its own data: its runs have none.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from typing import Any

import numpy as np

from prefect_hyperband.trainers import data as datasets
from prefect_hyperband.trainers import tables
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.layout import read_part

CONTEXTS = ("training", "validation")
_SOURCES = {
    "bank-marketing": "prefect_hyperband/data/" + "/".join(datasets.BANK_MARKETING[1:]),
    "digits": "sklearn.datasets.load_digits",
    "breast-cancer": "sklearn.datasets.load_breast_cancer",
}


def digest(*arrays: Any) -> str:
    """A digest of the content: sha256 over the arrays' shapes, types and bytes (16 hex digits)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def content_digest(spec: DataSpec) -> str:
    """The data's digest whatever its split (seed, validation fraction): every row, features and target, in a
    sorted order. Two jobs on the same data have the same one (``--warm-start`` compares them). A table in parts:
    its files' listing (names, sizes, ETags or times), never its rows."""
    if spec.data not in _SOURCES and tables.in_parts(spec.data):
        return "listing-" + tables.find(spec.data).digest
    ds = datasets.load(spec)
    X = np.concatenate([ds.X_train, ds.X_val])
    y = np.concatenate([ds.y_train, ds.y_val])
    rows = np.column_stack([X.reshape(len(X), -1), y.reshape(len(y), -1)]).astype(float)
    order = np.lexsort(rows.T[::-1])
    return digest(np.ascontiguousarray(X[order]), np.ascontiguousarray(y[order]))


@functools.lru_cache(maxsize=8)
def mlflow_datasets(spec: DataSpec) -> tuple[Any, Any]:
    """(training, validation) as MLflow pandas datasets: the encoded features and the target, as the trainers see
    them (cached per process: the digest reads every row once)."""
    import mlflow.data
    import pandas as pd

    name = os.path.basename(spec.data.rstrip("/")) if spec.data not in _SOURCES else spec.data
    lineage = tables.lineage_of(spec.data) if spec.data not in _SOURCES and tables.in_parts(spec.data) else None
    ds = _first_part(spec) if lineage else datasets.load(spec)
    out = []
    with warnings.catch_warnings():  # MLflow's hints on integer columns and on a path's two readings
        warnings.simplefilter("ignore")
        for context, X, y in (("training", ds.X_train, ds.y_train), ("validation", ds.X_val, ds.y_val)):
            frame = pd.DataFrame(X, columns=ds.feature_names)
            frame[ds.target] = y
            # a table in parts: the digest of its files' listing (names, sizes, ETags or times) and of the split,
            # not of every byte
            named = (hashlib.sha256(f"{lineage['digest']}:{context}:{spec.seed}:{spec.validation_fraction}".encode())
                     .hexdigest()[:16] if lineage else digest(X, y))
            out.append(mlflow.data.from_pandas(frame, source=_source(spec), targets=ds.target,
                                               name=f"{name} ({context})", digest=named))
    return out[0], out[1]


#: the rows of a table's first part that stand for it in MLflow (its schema; ``_entities`` gives its size)
SAMPLE_ROWS = 10_000


def _first_part(spec: DataSpec) -> datasets.Dataset:
    """A table in parts as the first ``SAMPLE_ROWS`` rows of its first part: the job's process reads no more of it
    for its lineage."""
    table, shape = tables.find(spec.data), datasets.layout_of(spec)
    X_train, y_train, X_val, y_val = read_part(table, table.parts[0], shape, spec.seed, spec.validation_fraction,
                                               limit=SAMPLE_ROWS)
    return datasets.Dataset(X_train, y_train, X_val, y_val, shape.feature_names, shape.task, list(shape.classes),
                            shape.target)


def _source(spec: DataSpec) -> Any:
    """A dataset source MLflow shows as given: a local file for a CSV, the loader's or package file's name else."""
    from mlflow.data.code_dataset_source import CodeDatasetSource

    if spec.data in _SOURCES:
        return CodeDatasetSource(tags={"source": _SOURCES[spec.data], "split_seed": str(spec.seed),
                                       "validation_fraction": str(spec.validation_fraction)})
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    return resolve_dataset_source(spec.data if "://" in spec.data else os.path.abspath(spec.data))


def lineage_tags(spec: DataSpec | None) -> dict[str, str]:
    """The parent run's tags naming its data where it lives: URL, format, parts, bytes and the listing's digest
    (none for a bundled data set or a user's own code)."""
    try:
        lineage = tables.lineage_of(spec.data) if spec is not None else None
    except Exception:  # noqa: BLE001  (a trial pool's data, not readable here: the run goes without these tags)
        lineage = None
    return {f"hyperband.data.{k}": str(v) for k, v in (lineage or {}).items()}


def inputs(spec: DataSpec | None) -> list[Any]:
    """The run inputs to log: each dataset with its context tag; none for a user's own code (``spec`` None)."""
    if spec is None:
        return []
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return [DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, context)])
            for entity, context in zip(_entities(spec), CONTEXTS)]


@functools.lru_cache(maxsize=8)
def _entities(spec: DataSpec) -> tuple[Any, ...]:
    """The datasets as MLflow entities (their schema and profile computed once per job, quietly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entities = tuple(d._to_mlflow_entity() for d in mlflow_datasets(spec))
    if spec.data in _SOURCES or not tables.in_parts(spec.data):
        return entities

    from mlflow.entities import Dataset as Entity

    lineage, shape = tables.lineage_of(spec.data), datasets.layout_of(spec)
    # the whole table's size, not the sample's
    profile = json.dumps({"num_rows": shape.rows, "num_parts": lineage["parts"], "bytes": lineage["bytes"],
                          "schema_of": f"the first {SAMPLE_ROWS:,} rows of the first part"})
    return tuple(Entity(e.name, e.digest, e.source_type, e.source, e.schema, profile) for e in entities)


__all__ = ["CONTEXTS", "content_digest", "digest", "inputs", "lineage_tags", "mlflow_datasets"]
