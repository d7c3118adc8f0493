"""A built-in model logged in its MLflow flavour (``trainers.base.Flavoured``, from the model's plug-in: the plug-ins
describe the model, MLflow is imported in ``tasks/`` alone, ``tests/test_import_graph.py``), and MLflow itself loaded
for the job's terminal."""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Mapping
from typing import Any

from prefect_hyperband.trainers.base import Flavoured


def log_flavoured(described: Flavoured, tags: Mapping[str, str] | None = None) -> Any:
    """``mlflow.<flavour>.log_model`` of the described model in the active run, as ``model``, with its signature,
    input example, requirements, code and ``tags``; MLflow's ``ModelInfo``."""
    from mlflow.models import infer_signature

    flavour = importlib.import_module(f"mlflow.{described.flavour}")
    with tempfile.TemporaryDirectory() as tmp:
        code = {"code_paths": [described.code(tmp)]} if described.code is not None else {}
        return flavour.log_model(
            described.model, name="model", signature=infer_signature(described.example, described.output),
            input_example=described.example, pip_requirements=list(described.requirements), tags=dict(tags or {}),
            **code,
        )


def load_mlflow() -> None:
    """MLflow imported: it sets up its logger as it is, which the job's terminal (``app.terminal.JobLog``) then
    quiets."""
    import mlflow  # noqa: F401
