"""The trainer interface every model implements: plain Python, callable from a test, a task or a benchmark."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from prefect_hyperband.common.files import write_json_atomic


@dataclass(frozen=True)
class Evaluation:
    """The validation metric of a checkpoint (of several objectives: their values, the metric first), and the
    seconds it took; ``metrics``: everything measured with it (the metric, the costs, a user's other metrics)."""

    score: float | tuple[float, ...]
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Flavoured:
    """A built-in model as MLflow logs it in one of its flavours (``tracking.flavours`` logs it: MLflow is imported there
    alone): the flavour's module name (``mlflow.<flavour>``), the model object, an input example with the model's
    output on it (the signature), the pip requirements, and ``code`` (given a folder, the package it writes there for
    the model's ``code_paths``)."""

    flavour: str
    model: Any
    example: Any
    output: Any
    requirements: tuple[str, ...] = ()
    code: Any = None


@dataclass(frozen=True)
class TrainResult:
    """One call of ``train``: the trial now holds ``resource`` units in ``checkpoint``."""

    checkpoint: str
    resource: int  # cumulative units after this call
    resource_trained: int  # units trained by this call (resource - resource of the checkpoint it resumed)
    seconds: float  # wall time of the call, start-up included
    workers: int
    #: per-unit metrics recorded while training, e.g. [{"step": 4, "train_loss": 0.3, "val_accuracy": 0.9}]
    history: list[dict[str, float]] = field(default_factory=list)
    #: one-off figures of the call, e.g. {"startup_seconds": 1.2, "global_batch_size": 128}; a remote trial-rung's
    #: also its "worker" (machine:pid, ``flows.work_pool.outcome_of``: MLflow's ``hyperband.worker`` tag)
    info: dict[str, Any] = field(default_factory=dict)
    #: the trained model in this process (XGBoost's booster), handed to ``measure`` with the checkpoint so that it is
    #: not loaded again; never saved, sent or compared (``to_json`` leaves it out), dropped once measured
    model: Any = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(replace(self, model=None)).items() if k != "model"}


class Trainer(Protocol):
    """A model family on one data set; one instance per job, shared by its trials. A trainer that trains on a
    cluster's groups of workers also has ``worker_groups`` (``dask_groups.WorkerGroups``; see ``placement``)."""

    model: str
    workers: int
    metric: str

    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        """Train ``config`` up to ``resource`` units, resuming from ``checkpoint`` (never from scratch when given);
        write the new checkpoint to ``out``."""

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The validation metric of a checkpoint, computed centrally on the whole validation set, and what else
        the trainer measured of it (the built-ins: ``predict_ms``; a user's code: its other reported figures).
        ``model``: the ``TrainResult.model`` that ``train`` returned with the checkpoint, when it gave one.
        The built-in trainers also have ``evaluate(checkpoint)``, the value alone."""

    def close(self) -> None:
        """Release what the trainer started (clusters, process groups)."""


class Placement(Protocol):
    """Where a trainer's trial-rungs run when not in this process: a Dask cluster's groups of workers. The model's
    plug-in gives one to its trainer, as ``placement(trainer)``; trainers import no placement. The ranks' kind
    (``executors.dask_ranks.OnDask``: torch, a function, a script) also has ``train(trainer, *args)``: the trainer
    hands it a trial-rung and gets back what its ranks returned. XGBoost's (``executors.dask_xgboost.XGBoostOnDask``)
    has the ``client`` that ``xgboost.dask`` trains with on a group it takes."""

    #: the free groups of workers, one reserved per trial-rung (``placement`` below)
    worker_groups: Any

    def close(self) -> None:
        """Leave the cluster (one the placement started is shut down, an external one keeps running)."""


class Placed:
    """What a trainer given a placement by its plug-in shares (the user's function and script, torch): the
    placement (``_dask``, from ``placement(self)`` in the trainer's constructor), its groups of workers, and
    leaving it when the trainer closes."""

    _dask: Placement | None = None

    @property
    def worker_groups(self) -> Any:
        """The Dask workers' groups a trial-rung runs on (None: this machine)."""
        return self._dask.worker_groups if self._dask is not None else None

    def leave_placement(self) -> None:
        """Leave the cluster, once (an external one keeps running)."""
        if self._dask is not None:
            self._dask.close()
            self._dask = None


def size_of(checkpoint: str) -> int:
    """Bytes of a checkpoint: its file, with the directory of the same name beside it (a user trainer's)."""
    path = Path(checkpoint)
    total = path.stat().st_size if path.is_file() else 0
    folder = path.with_suffix("")
    if folder != path and folder.is_dir():
        total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total


@contextlib.contextmanager
def placement(trainer: Any) -> Iterator[tuple[str, ...]]:
    """The workers the calling thread's next ``train`` will run on, held for it meanwhile: a free group of a
    trainer with ``worker_groups`` (a Dask cluster's), reserved until the block ends; () for one that trains here."""
    groups = getattr(trainer, "worker_groups", None)
    if groups is None:
        yield ()
        return
    with groups.reserve() as group:
        yield group


def checkpoint_resource(meta_path: str | os.PathLike[str]) -> int:
    """Units held by a checkpoint, from the JSON file written beside it."""
    return int(json.loads(Path(meta_path).read_text())["resource"])


def write_sidecar(checkpoint: str, resource: int, **extra: Any) -> None:
    """``<checkpoint>.json``, written after the checkpoint: the units it holds and its size in bytes (so a
    checkpoint cut short is recognised, whatever its format)."""
    write_json_atomic(f"{checkpoint}.json", {"resource": resource, "bytes": os.path.getsize(checkpoint), **extra})


def checkpoint_damage(checkpoint: str) -> str | None:
    """Why a checkpoint file cannot be the one its trainer wrote (missing, empty, shorter or longer than its
    sidecar says, a JSON checkpoint or sidecar that does not parse); None when it looks whole."""
    path = Path(checkpoint)
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size == 0:
        return "empty (0 bytes)"
    try:
        if path.suffix == ".json":  # the checkpoint of synthetic and user code: its own record
            int(json.loads(path.read_text())["resource"])
        meta = Path(f"{checkpoint}.json")
        if meta.is_file():
            held = json.loads(meta.read_text())
            int(held["resource"])
            if "bytes" in held and int(held["bytes"]) != size:
                return f"{size} bytes where {held['bytes']} were written"
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable ({type(exc).__name__})"
    return None
