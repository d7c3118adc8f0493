"""An instant closed-form learning curve, for demos and for measuring the orchestrator."""

from __future__ import annotations

from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import synthetic_trainer
from prefect_hyperband.trainers.registry import Model
from prefect_hyperband.trainers.synthetic_trainer import SyntheticTrainer


def build(settings: Any):
    return SyntheticTrainer(seed=settings.seed, workers=settings.workers, **dict(settings.extra))


def space():
    return synthetic_trainer.DEFAULT_SPACE, synthetic_trainer.PARAMS, synthetic_trainer.DEFAULT_CONFIG


def metric(spec: Any, given: str | None) -> str:
    if given not in (None, SyntheticTrainer.metric):
        raise InputError(f"--metric {given}: the synthetic model reports {SyntheticTrainer.metric} only")
    return SyntheticTrainer.metric


def extra(params: Any) -> tuple[tuple[str, Any], ...]:
    return (("seconds_per_unit", params.unit_seconds),)


def check_config(config: dict[str, Any]) -> None:
    SyntheticTrainer().resolve(config)


MODEL = Model("synthetic", build, "an instant closed-form learning curve (--unit-seconds emulates cost)",
              space=space, metric=metric, extra=extra, order=2, reads_data=False, fields=("unit_seconds",),
              check_config=check_config)
