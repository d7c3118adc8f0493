"""Build a job's trainer from plain settings, once per process, and share it between its trials."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.base import Trainer
from prefect_hyperband.trainers.data import DataSpec


@dataclass(frozen=True)
class TrainerSettings:
    """Everything a trainer needs, small and hashable: tasks pass this, never a trainer or a data frame."""

    model: str
    data: DataSpec
    workers: int = 1
    metric: str | None = None
    seed: int = 0
    milestones: tuple[int, ...] = ()
    dask_address: str | None = None
    threads: int | None = None  # CPU threads per trial
    rounds_per_unit: int = 10  # xgboost
    # torch across machines: the trainer can build a multi-node launch, but nothing starts the other
    # machines' ranks yet (a trial pool's flow runs would); no flag sets these, so they stay 1 and None
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    trainer: str | None = None  # function: path/to/file.py:function or package.module:function
    script: str | None = None  # script: a training script run under torch's launcher
    timeout: float | None = None  # --trial-timeout, for trainers that run processes (they kill them themselves)
    extra: tuple[tuple[str, Any], ...] = field(default=())


def model_space(model: str) -> tuple[dict[str, dict[str, Any]], frozenset[str] | None, dict[str, Any]]:
    """(default search space, accepted parameter names, default config) of a model."""
    return registry.get(model).space()


def build(settings: TrainerSettings) -> Trainer:
    return registry.get(settings.model).build(settings)


_trainers: dict[TrainerSettings, Trainer] = {}
_lock = threading.Lock()


def get(settings: TrainerSettings) -> Trainer:
    """The process's trainer for these settings, built on first use (a cluster starts once per job)."""
    with _lock:
        trainer = _trainers.get(settings)
        if trainer is None:
            trainer = _trainers[settings] = build(settings)
        return trainer


def interrupt(settings: TrainerSettings) -> None:
    """Stop the trainings of these settings that run in processes (launchers, ranks, a local cluster): the job is stopping."""
    with _lock:
        trainer = _trainers.get(settings)
    if trainer is not None:
        trainer.close()


def interrupt_all() -> None:
    """Every trainer of this process, at once (a second Ctrl-C)."""
    with _lock:
        trainers = list(_trainers.values())
    for trainer in trainers:
        try:
            trainer.close()
        except Exception:
            pass


def release(settings: TrainerSettings) -> None:
    """Close and forget the trainer of these settings (end of job)."""
    with _lock:
        trainer = _trainers.pop(settings, None)
    if trainer is not None:
        trainer.close()
