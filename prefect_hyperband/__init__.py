"""prefect-hyperband: exact Hyperband and ASHA as Prefect flows, tracked in MLflow.

The one import package of the distribution. In the repository its subpackages live at the
root (``app/``, ``flows/``, ``tasks/``, ``hyperband/``, ``trainers/``, ``data/``, ``deployments/``) and
are mapped under this name by ``pyproject.toml``. Importing this module imports nothing heavy;
``tune``, ``Trial``, ``report`` and ``JobResult`` load on first use::

    import prefect_hyperband as hb

    def train(trial: hb.Trial) -> dict[str, float]:
        ...  # trial.config, trial.resource, trial.start, trial.checkpoint, trial.checkpoint_dir
        return {"val_loss": 0.12}

    result = hb.tune(train, space="space.yaml", metric="val_loss", direction="minimize", max_resource=27)
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

_TREE = Path(__file__).resolve().parent.parent
if (_TREE / "pyproject.toml").is_file() and (_TREE / "trainers").is_dir() and str(_TREE) not in __path__:
    # a source checkout on sys.path, not installed (``benchmarks/gpu_check.py`` on a machine with torch alone): the
    # subpackages at the root are this package's, as pyproject.toml maps them when it is installed
    __path__.append(str(_TREE))

try:
    __version__ = version("prefect-hyperband")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"

_LAZY = {
    "tune": ("prefect_hyperband.app.api", "tune"),
    "JobResult": ("prefect_hyperband.app.api", "JobResult"),
    "Trial": ("prefect_hyperband.trainers.function", "Trial"),
    "report": ("prefect_hyperband.trainers.function", "report"),
    "StopToken": ("prefect_hyperband.trainers.stopping", "StopToken"),
    "JobCancelled": ("prefect_hyperband.app.api", "JobCancelled"),
    "EveryTrialFailed": ("prefect_hyperband.app.api", "EveryTrialFailed"),
}

__all__ = ["EveryTrialFailed", "JobCancelled", "JobResult", "StopToken", "Trial", "__version__", "report", "tune"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'prefect_hyperband' has no attribute {name!r}")
