"""The user's own training function, ``train(trial) -> {metric: value}`` (``--trainer file.py:train``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from prefect_hyperband.executors.dask_function import function_on
from prefect_hyperband.trainers.function import FunctionTrainer
from prefect_hyperband.trainers.gpus import of_settings
from prefect_hyperband.trainers.registry import Model


def build(settings: Any):
    assert settings.trainer and settings.metric
    placement = None
    if settings.dask_address:  # each trial-rung on a free worker of the cluster: the executor's placement
        placement = function_on(settings.dask_address)

    return FunctionTrainer(settings.trainer, settings.metric, workers=settings.workers, placement=placement,
                           gpus=of_settings(settings))


def log_model(trainer: Any, checkpoint: str, tags: dict[str, str] | None = None):
    """The user's ``log_model(checkpoint_dir)``, when the trainer's module defines one (it logs the model in
    its flavour, e.g. ``mlflow.sklearn.log_model``, and returns the ``ModelInfo``); else nothing to register.

    A hook that takes ``tags`` gets the job's, to pass to its flavour's ``log_model(tags=...)``: the model is born
    with them, and a retry after MLflow went away finds it. One that does not is called without them; the
    champion's writer (``tracking.champion``) sets them just after (MLflow gone in between leaves an untagged model,
    and the retry logs a second one)."""
    hook = getattr(trainer, "log_model_hook", None)
    if hook is None:
        return None
    folder = str(Path(checkpoint).with_suffix(""))
    return hook(folder, tags=tags) if "tags" in inspect.signature(hook).parameters else hook(folder)


MODEL = Model("function", build, "your training function (--trainer file.py:train)", user_code="trainer",
              log_model=log_model, order=10, gpus=True)
