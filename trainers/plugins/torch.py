"""A PyTorch CNN/MLP trained with DDP across ``--workers`` ranks; one unit = one epoch."""

from __future__ import annotations

import os
import shutil
from typing import Any

from prefect_hyperband.executors.dask_ranks import torch_on
from prefect_hyperband.executors.torch_pool import warm_pools
from prefect_hyperband.trainers.base import Flavoured
from prefect_hyperband.trainers.gpus import of_settings
from prefect_hyperband.trainers.plugins.xgboost import metric as from_data
from prefect_hyperband.trainers.registry import Model


def build(settings: Any):
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    kwargs: dict[str, Any] = dict(settings.extra)
    if settings.threads:  # the job's share of cores per trial, split between its ranks
        kwargs.setdefault("threads_per_rank", max(1, settings.threads // settings.workers))
    if settings.timeout:
        kwargs.setdefault("trial_timeout", settings.timeout)
    if settings.dask_address:  # the ranks on the cluster's workers: the executor's placement, given to the trainer
        kwargs["placement"] = torch_on(settings.dask_address)
    else:  # this machine's ranks, kept up between trial-rungs (``warm=False`` in the model's knobs turns it off)
        kwargs["pools"] = warm_pools

    kwargs.setdefault("deterministic", settings.deterministic)
    if not settings.dask_address:  # (a Dask group's GPUs are its workers' own)
        kwargs.setdefault("gpus", of_settings(settings))
    return TorchTrainer(settings.data, workers=settings.workers, metric=settings.metric, seed=settings.seed, **kwargs)


def space():
    from prefect_hyperband.trainers.torch import config as m

    return m.DEFAULT_SPACE, m.PARAMS, m.DEFAULT_CONFIG


def gpu_space() -> dict[str, dict[str, Any]]:
    from prefect_hyperband.trainers.torch import config as m

    return m.GPU_SPACE


def metric(spec: Any, given: str | None) -> str:
    return from_data(spec, given)


def log_model(trainer: Any, checkpoint: str):
    """The module, for MLflow's PyTorch flavour (``tracking.flavours``); its class ships as code, so loading needs no
    install of ours."""
    import torch

    example = trainer.example(5)
    module = trainer.load_model(checkpoint)
    with torch.no_grad():
        output = module(torch.from_numpy(example)).numpy()
    return Flavoured("pytorch", module, example, output, (f"torch=={torch.__version__.split('+')[0]}",), _model_code)


def _model_code(tmp: str) -> str:
    """``prefect_hyperband.trainers.torch.models`` alone, as a package a model's loader can import without us installed."""
    from prefect_hyperband.trainers.torch import models

    package = os.path.join(tmp, "prefect_hyperband")
    os.makedirs(os.path.join(package, "trainers", "torch"))
    for init in ("__init__.py", os.path.join("trainers", "__init__.py"), os.path.join("trainers", "torch", "__init__.py")):
        open(os.path.join(package, init), "w").close()
    shutil.copy(models.__file__, os.path.join(package, "trainers", "torch", "models.py"))
    return package


def check_config(config: dict[str, Any]) -> None:
    from prefect_hyperband.trainers.torch.config import resolve_config

    resolve_config(config)


MODEL = Model(
    "torch", build, "PyTorch CNN/MLP with DDP (one unit = one epoch)", space=space, metric=metric,
    checkpoint_suffix=".pt", local_workers=True, log_model=log_model, order=1, check_config=check_config,
    gpu_space=gpu_space,
    needs=(("torch", "torch"),), gpus=True, extra=lambda params: (("precision", params.precision),),
    fields=("precision",),
)
