"""XGBoost boosters on a tabular data set; one unit = ``rounds_per_unit`` boosting rounds."""

from __future__ import annotations

from typing import Any

import numpy as np

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors.dask_xgboost import xgboost_on
from prefect_hyperband.trainers.base import Flavoured
from prefect_hyperband.trainers.gpus import of_settings
from prefect_hyperband.trainers.registry import Model
from prefect_hyperband.trainers.xgboost import config as xgboost_config


def build(settings: Any):
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    placement = None
    if settings.workers > 1 or settings.dask_address:  # allreduce on a Dask cluster's groups: the executor's placement
        placement = xgboost_on(settings.dask_address)
    return XGBoostTrainer(
        settings.data, workers=settings.workers, metric=settings.metric, seed=settings.seed,
        milestones=settings.milestones, placement=placement, nthread=settings.threads, **dict(settings.extra),
        gpus=of_settings(settings) if placement is None else None,  # (a Dask group's GPUs: its workers' own)
    )


def extra(params: Any) -> tuple[tuple[str, Any], ...]:
    """The model's knob, as every model's travels (``TrainerSettings.extra``)."""
    return (("rounds_per_unit", params.rounds_per_unit), ("external_memory", params.external_memory))


def space():
    return xgboost_config.DEFAULT_SPACE, xgboost_config.PARAMS, xgboost_config.DEFAULT_CONFIG


def metric(spec: Any, given: str | None) -> str:
    from prefect_hyperband.trainers import data

    dataset = data.layout_of(spec)  # a table in parts: from its schemas and the columns it needs
    chosen = given or dataset.default_metric
    data.check_metric(dataset, chosen)
    return chosen


def log_model(trainer: Any, checkpoint: str):
    """The booster, for MLflow's XGBoost flavour (``tracking.flavours``), with an input example and its predictions."""
    import pandas as pd
    import xgboost as xgb

    names = list(trainer.info.feature_names)
    example = pd.DataFrame(trainer.example(5), columns=names)
    booster = trainer.booster(checkpoint)
    booster.feature_names = names
    return Flavoured("xgboost", booster, example, booster.inplace_predict(example), (f"xgboost=={xgb.__version__}",))


def check_config(config: dict[str, Any]) -> None:
    """XGBoost's own parameter checks: one boosting round on four rows (milliseconds)."""
    import xgboost as xgb

    tiny = xgb.DMatrix(np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]), label=[0, 1, 0, 1])
    try:
        xgb.train({**config, "objective": "binary:logistic", "tree_method": "hist", "nthread": 1, "verbosity": 0},
                  tiny, 1)
    except xgb.core.XGBoostError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise InputError(f"XGBoost refuses it: {lines[0] if lines else type(exc).__name__}") from None


MODEL = Model(
    "xgboost", build, "XGBoost (one unit = --rounds-per-unit boosting rounds)", space=space, metric=metric,
    checkpoint_suffix=".ubj", local_workers=True, log_model=log_model, order=0, fields=("rounds_per_unit", "external_memory"),
    extra=extra, check_config=check_config, gpus=True, gpu_ranks=False,  # --workers N here: a local Dask cluster's CPUs
)
