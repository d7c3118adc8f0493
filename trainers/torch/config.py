"""The torch model's hyperparameters: their defaults, the default space, and a config checked and coerced."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.data import metric_direction

#: Trains digits (CNN, 2 workers, linear lr scaling) to >= 0.95 validation accuracy in well under 9 epochs.
DEFAULT_CONFIG: dict[str, Any] = {
    "lr": 0.05,
    "batch_size": 32,
    "weight_decay": 1e-4,
    "width": 32,
    "dropout": 0.1,
    "momentum": 0.9,
    "lr_scaling": "linear",
    "warmup_epochs": 1,
}
#: Config keys ``train`` accepts (``seed`` overrides the trainer's seed for one trial).
PARAMS = frozenset({*DEFAULT_CONFIG, "seed"})
LR_SCALING = ("linear", "none")
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "float", "low": 5e-3, "high": 0.2, "log": True},
    "batch_size": {"type": "categorical", "choices": [16, 32, 64]},
    "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-3, "log": True},
    "width": {"type": "int", "low": 16, "high": 64},
    "dropout": {"type": "float", "low": 0.0, "high": 0.3},
    "momentum": {"type": "float", "low": 0.5, "high": 0.95},
}
#: The default space when the trials have GPUs (issue 76): an H200 ran a step of 32 rows in 2.4 ms, launch- and
#: sync-bound, no faster than the CPU; batches of 128 to 1024 and widths of 64 to 512 keep it busy. The learning rate
#: reaches higher with the larger batches (Goyal et al., 2017); ``lr_scaling`` still scales it with the ranks.
GPU_SPACE: dict[str, dict[str, Any]] = {
    **DEFAULT_SPACE,
    "lr": {"type": "float", "low": 1e-2, "high": 0.4, "log": True},
    "batch_size": {"type": "categorical", "choices": [128, 256, 512, 1024]},
    "width": {"type": "int", "low": 64, "high": 512, "log": True},
}



def as_int(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if not float(value).is_integer():
        raise InputError(f"{name} must be an integer, got {value!r}")
    return int(value)


def as_float(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise InputError(f"{name} must be finite, got {value!r}")
    return float(value)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


def resolve_config(config: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """``config`` over ``DEFAULT_CONFIG``, checked and coerced to plain types (InputError on a bad value)."""
    unknown = sorted(str(k) for k in config if k not in PARAMS)
    require(not unknown, f"unknown torch hyperparameter(s) {', '.join(unknown)}; accepted: {', '.join(sorted(PARAMS))}")
    merged = {**DEFAULT_CONFIG, "seed": seed, **config}
    out: dict[str, Any] = {
        "lr": as_float("lr", merged["lr"]),
        "batch_size": as_int("batch_size", merged["batch_size"]),
        "weight_decay": as_float("weight_decay", merged["weight_decay"]),
        "width": as_int("width", merged["width"]),
        "dropout": as_float("dropout", merged["dropout"]),
        "momentum": as_float("momentum", merged["momentum"]),
        "lr_scaling": str(merged["lr_scaling"]),
        "warmup_epochs": as_int("warmup_epochs", merged["warmup_epochs"]),
        "seed": as_int("seed", merged["seed"]),
    }
    require(out["lr"] > 0, f"lr must be > 0, got {out['lr']}")
    require(out["batch_size"] >= 1, f"batch_size must be >= 1, got {out['batch_size']}")
    require(out["weight_decay"] >= 0, f"weight_decay must be >= 0, got {out['weight_decay']}")
    require(out["width"] >= 1, f"width must be >= 1, got {out['width']}")
    require(0 <= out["dropout"] < 1, f"dropout must be in [0, 1), got {out['dropout']}")
    require(0 <= out["momentum"] < 1, f"momentum must be in [0, 1), got {out['momentum']}")
    require(out["lr_scaling"] in LR_SCALING, f"lr_scaling must be one of {', '.join(LR_SCALING)}, got {out['lr_scaling']!r}")
    require(out["warmup_epochs"] >= 0, f"warmup_epochs must be >= 0, got {out['warmup_epochs']}")
    return out


def effective_lr(config: Mapping[str, Any], world_size: int) -> float:
    """Goyal et al. (2017): with ``lr_scaling: linear`` the lr grows with the number of replicas."""
    return float(config["lr"]) * (world_size if config["lr_scaling"] == "linear" else 1)


def check_metric(metric: str, task: str) -> None:
    metric_direction(metric)  # unknown names
    allowed = {"regression": ("rmse",), "binary": ("auc", "accuracy", "logloss"), "multiclass": ("accuracy", "logloss")}
    require(metric in allowed[task], f"metric {metric!r} does not fit a {task} task; use one of {', '.join(allowed[task])}")
