"""The user's own training script, run under torch's launcher (``--script train.py --workers N``)."""

from __future__ import annotations

from typing import Any

from prefect_hyperband.executors.dask_script import script_on
from prefect_hyperband.trainers.gpus import of_settings
from prefect_hyperband.trainers.registry import Model
from prefect_hyperband.trainers.script import ScriptTrainer


def build(settings: Any):
    assert settings.script and settings.metric
    placement = None
    if settings.dask_address:  # the ranks on a group of the cluster's workers: the executor's placement
        placement = script_on(settings.dask_address)

    return ScriptTrainer(settings.script, settings.metric, workers=settings.workers, threads=settings.threads,
                         timeout=settings.timeout, placement=placement, gpus=of_settings(settings))


MODEL = Model("script", build, "your training script under torch's launcher (--script train.py)", user_code="script",
              local_workers=True, order=11, gpus=True)
