"""Build a job's trainer from plain settings, once per process, and share it between its trials."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.trainers.base import Trainer
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.errors import InputError

MODELS = ("xgboost", "torch", "synthetic")  # built in; "function" is the user's own (``trainer`` names it)


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
    nnodes: int = 1  # torch
    rdzv_endpoint: str | None = None  # torch
    trainer: str | None = None  # function: path/to/file.py:function or package.module:function
    script: str | None = None  # script: a training script run under torch's launcher
    timeout: float | None = None  # --trial-timeout, for trainers that run processes (they kill them themselves)
    extra: tuple[tuple[str, Any], ...] = field(default=())


def model_space(model: str) -> tuple[dict[str, dict[str, Any]], frozenset[str] | None, dict[str, Any]]:
    """(default search space, accepted parameter names, default config) of a model."""
    if model == "xgboost":
        from prefect_hyperband.trainers import xgboost_trainer as m
    elif model == "torch":
        from prefect_hyperband.trainers import torch_ddp as m  # type: ignore[no-redef]
    elif model == "synthetic":
        from prefect_hyperband.trainers import synthetic as m  # type: ignore[no-redef]
    elif model in ("function", "script"):  # the user's space names the parameters; there is no default config
        return {}, None, {}  # type: ignore[return-value]
    else:
        raise InputError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    return m.DEFAULT_SPACE, m.PARAMS, m.DEFAULT_CONFIG


def build(settings: TrainerSettings) -> Trainer:
    if settings.model == "xgboost":
        from prefect_hyperband.trainers.xgboost_trainer import XGBoostTrainer

        return XGBoostTrainer(
            settings.data,
            workers=settings.workers,
            metric=settings.metric,
            seed=settings.seed,
            rounds_per_unit=settings.rounds_per_unit,
            milestones=settings.milestones,
            dask_address=settings.dask_address,
            nthread=settings.threads,
        )
    if settings.model == "torch":
        from prefect_hyperband.trainers.torch_ddp import TorchTrainer

        kwargs: dict[str, Any] = dict(settings.extra)
        if settings.threads:  # the job's share of cores per trial, split between its ranks
            kwargs.setdefault("threads_per_rank", max(1, settings.threads // settings.workers))
        if settings.timeout:
            kwargs.setdefault("trial_timeout", settings.timeout)
        return TorchTrainer(
            settings.data,
            workers=settings.workers,
            metric=settings.metric,
            seed=settings.seed,
            nnodes=settings.nnodes,
            rdzv_endpoint=settings.rdzv_endpoint,
            **kwargs,
        )
    if settings.model == "synthetic":
        from prefect_hyperband.trainers.synthetic import SyntheticTrainer

        return SyntheticTrainer(seed=settings.seed, workers=settings.workers, **dict(settings.extra))
    if settings.model == "function":
        from prefect_hyperband.trainers.function import FunctionTrainer

        assert settings.trainer and settings.metric
        return FunctionTrainer(settings.trainer, settings.metric, workers=settings.workers)
    if settings.model == "script":
        from prefect_hyperband.trainers.script import ScriptTrainer

        assert settings.script and settings.metric
        return ScriptTrainer(settings.script, settings.metric, workers=settings.workers, threads=settings.threads,
                             timeout=settings.timeout)
    raise InputError(f"unknown model {settings.model!r}; choose one of {', '.join(MODELS)}")


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
