"""Build a job's trainer from plain settings, once per job, and share it between its trials."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
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
    trainer: str | None = None  # function: path/to/file.py:function or package.module:function
    script: str | None = None  # script: a training script run under torch's launcher
    timeout: float | None = None  # --trial-timeout, for trainers that run processes (they kill them themselves)
    gpus: tuple[int, ...] | None = None  # --gpus (None: every GPU the host running the trainer sees)
    device: str = "auto"  # --device: auto, cpu, cuda (``trainers.gpus.choose`` on the trainer's host)
    deterministic: bool = False  # --deterministic: torch's deterministic algorithms
    extra: tuple[tuple[str, Any], ...] = field(default=())  # the model's own knobs (``Model.extra``)


def model_space(model: str) -> tuple[dict[str, dict[str, Any]], frozenset[str] | None, dict[str, Any]]:
    """(default search space, accepted parameter names, default config) of a model."""
    return registry.get(model).space()


def build(settings: TrainerSettings) -> Trainer:
    return registry.get(settings.model).build(settings)


class Trainers:
    """One job's trainers: each built on first use for its settings (a cluster starts, the data loads, once per
    job) and shared by the job's trials; all closed when the job ends. Two jobs, even with equal settings, have
    two: one job's end never closes the other's trainer."""

    def __init__(self) -> None:
        self._built: dict[TrainerSettings, Trainer] = {}
        self._lock = threading.Lock()

    def get(self, settings: TrainerSettings) -> Trainer:
        with self._lock:
            trainer = self._built.get(settings)
            if trainer is None:
                trainer = self._built[settings] = build(settings)
            return trainer

    def interrupt(self, settings: TrainerSettings) -> None:
        """Stop the trainings of these settings that run in processes (launchers, ranks, a local cluster)."""
        with self._lock:
            trainer = self._built.get(settings)
        if trainer is not None:
            trainer.close()

    def close_all(self) -> None:
        """Close and forget every trainer (the job's end; a second Ctrl-C)."""
        with self._lock:
            built, self._built = list(self._built.values()), {}
        for trainer in built:
            try:
                trainer.close()
            except Exception:  # closing what is left: one that fails must not keep the others open
                pass


_scope: contextvars.ContextVar[Trainers | None] = contextvars.ContextVar("hyperband_trainers", default=None)


@contextlib.contextmanager
def scope(trainers: Trainers | None = None, close: bool = True) -> Iterator[Trainers]:
    """The trainers (new ones, or ``trainers``) of the code run in this context and the contexts copied from it (one
    job), closed at the end unless ``close`` is false (a task worker's, kept warm for its next trial-rung)."""
    trainers = trainers if trainers is not None else Trainers()
    reset = _scope.set(trainers)
    try:
        yield trainers
    finally:
        _scope.reset(reset)
        if close:
            trainers.close_all()


def current() -> Trainers:
    trainers = _scope.get()
    if trainers is None:
        raise RuntimeError("no trainer scope: run this inside factory.scope() (a job sets one up)")
    return trainers


def get(settings: TrainerSettings) -> Trainer:
    """The job's trainer for these settings, built on first use."""
    return current().get(settings)
