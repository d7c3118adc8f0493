"""Models as plug-ins: one registry entry each, the built-ins (``xgboost``, ``torch``, ``synthetic``) and the
user's own code (``function``, ``script``) alike.

An entry says how to build the model's trainer from the job's settings, its default search space and
config, how the job's metric is chosen, its checkpoint file suffix, and, optionally, how to log a
checkpoint as an MLflow model in its flavour (then the best is registered with alias ``champion``).
Nothing else in the project switches on a model's name. Adding a model is one file in
``trainers/plugins/`` defining ``MODEL = Model(...)``; a model from another package registers through
the entry-point group ``prefect_hyperband.models`` (``name = "package.module:MODEL"``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import plugins

if TYPE_CHECKING:  # pragma: no cover
    from prefect_hyperband.trainers.base import Trainer
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.factory import TrainerSettings

ENTRY_POINTS = "prefect_hyperband.models"


def _no_space() -> tuple[dict[str, dict[str, Any]], frozenset[str] | None, dict[str, Any]]:
    return {}, None, {}


def _no_extra(params: Any) -> tuple[tuple[str, Any], ...]:
    return ()


@dataclass(frozen=True)
class Model:
    """A model family the tuner can tune."""

    name: str
    #: the trainer for a job's settings (imports the heavy libraries here, not at registration)
    build: Callable[[TrainerSettings], Trainer]
    description: str = ""
    #: (default search space, accepted parameter names or None for any, default config: the summary's baseline)
    space: Callable[[], tuple[dict[str, dict[str, Any]], frozenset[str] | None, dict[str, Any]]] = _no_space
    #: the job's metric from its data and ``--metric``; None: the user's own metric, named as they report it
    metric: Callable[[DataSpec, str | None], str] | None = None
    checkpoint_suffix: str = ".json"
    #: the TuneParams field that names the user's code (``trainer``, ``script``); None for a built-in
    user_code: str | None = None
    #: optional packages it imports, each with the extra that installs it (``("torch", "torch")``): a job whose model
    #: needs one that is missing ends before any training, in one line naming the extra (``missing_extra``)
    needs: tuple[tuple[str, str], ...] = ()
    #: ``--workers`` starts that many processes on this machine per trial (bounded by its cores)
    local_workers: bool = False
    #: its trials run on GPUs where a host has them (``--gpus``, ``--device``: ``trainers.gpus``)
    gpus: bool = False
    #: with ``--workers N`` on one machine, each of the N processes takes a GPU (False: the N train on the CPUs)
    gpu_ranks: bool = True
    #: its default search space when the trials have GPUs (GPU-sized batches and widths); None: ``space``'s
    gpu_space: Callable[[], dict[str, dict[str, Any]]] | None = None
    #: ``TrainerSettings.extra`` from the job's parameters (model-specific knobs)
    extra: Callable[[Any], tuple[tuple[str, Any], ...]] = _no_extra
    #: log ``checkpoint`` as an MLflow model in its flavour, inside the best trial's active run; returns the
    #: ``ModelInfo`` (then registered with alias ``champion``) or None when there is nothing to register. One that
    #: takes ``tags`` passes them to the flavour's ``log_model(tags=...)``: the logged model is born with the job's
    #: tags, so a retry after a cut finds it (``tracking.champion``); others are tagged just after
    log_model: Callable[..., Any] | None = None
    #: where it sorts in lists and help (built-ins first)
    order: int = 100
    #: it trains on ``--data`` (a synthetic curve does not: its parent run logs no data)
    reads_data: bool = True
    #: the TuneParams fields only this model reads (the parent run logs them for it, "" for the others)
    fields: tuple[str, ...] = ()
    #: the model's own check of one config (``InputError`` naming the parameter); the preflight runs it on each
    #: parameter's bounds and choices, so a space the model cannot take is one line before any training
    check_config: Callable[[dict[str, Any]], None] | None = None


_models: dict[str, Model] = {}
_loaded = threading.Event()
_lock = threading.RLock()


def register(model: Model) -> Model:
    with _lock:
        _models[model.name] = model
    return model


def _load() -> None:
    if _loaded.is_set():
        return
    with _lock:
        if _loaded.is_set():
            return

        for info in pkgutil.iter_modules(plugins.__path__):
            module = importlib.import_module(f"{plugins.__name__}.{info.name}")
            if isinstance(getattr(module, "MODEL", None), Model):
                register(module.MODEL)
        try:
            for ep in entry_points(group=ENTRY_POINTS):
                try:
                    model = ep.load()
                except Exception:  # a broken third-party plug-in does not take the built-ins down
                    continue
                if isinstance(model, Model):
                    register(model)
        except Exception:
            pass
        _loaded.set()


def get(name: str) -> Model:
    _load()
    model = _models.get(name)
    if model is None:
        raise InputError(f"unknown model {name!r}; choose one of {', '.join(names())}")
    return model


def names() -> tuple[str, ...]:
    _load()
    return tuple(sorted(_models, key=lambda n: (_models[n].order, n)))


def built_in() -> tuple[str, ...]:
    """The models that need no code of the user's (``--model`` choices)."""
    return tuple(n for n in names() if _models[n].user_code is None)


def missing_extra(name: str, workers: int = 1) -> str | None:
    """Why model ``name`` cannot run here (an optional package it needs is not installed: the extra to install), or
    None. A script with several ranks needs torch's launcher."""
    model = get(name)
    needs = list(model.needs) + ([("torch", "torch")] if model.user_code == "script" and workers > 1 else [])
    for module, extra in needs:
        if importlib.util.find_spec(module) is None:
            what = f"--model {name}" if model.user_code is None else f"--script with --workers {workers} (torch's launcher)"
            return (f"{what} needs {module}, which is not installed here: pip install 'prefect-hyperband[{extra}]' "
                    f"(or install your own {module} build first, a CUDA one on GPU machines)")
    return None


def model_specific_fields() -> tuple[str, ...]:
    """The TuneParams fields some model reads and others do not (``Model.fields``), sorted."""
    return tuple(sorted({f for n in names() for f in _models[n].fields}))


def user_code_fields() -> Mapping[str, str]:
    """TuneParams field -> model name, for the models that run the user's code."""
    return {_models[n].user_code: n for n in names() if _models[n].user_code}  # type: ignore[misc]
