"""The job context that tasks receive: small, frozen, made of paths, ids and numbers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.factory import TrainerSettings


@dataclass(frozen=True)
class Job:
    job_id: str
    job_dir: str
    settings: TrainerSettings
    metric: str
    direction: str  # "max" | "min"
    min_resource: int
    max_resource: int
    eta: int
    seed: int
    space: dict[str, dict[str, Any]]
    default_config: dict[str, Any]
    tracking_uri: str
    experiment: str
    concurrency: int
    mode: str = "hyperband"  # "hyperband" | "asha"
    sampler: str = "random"  # "random" | "tpe"
    parent_run_id: str | None = None
    trial_timeout: float | None = None  # seconds a trial-rung may take; None: from the job's measurements

    @property
    def metric_key(self) -> str:
        """The metric's name in MLflow: ``val_<metric>`` for the built-ins, the user's own name for theirs."""
        return self.metric if registry.get(self.settings.model).metric is None else f"val_{self.metric}"

    def with_parent(self, run_id: str) -> "Job":
        return replace(self, parent_run_id=run_id)

    def checkpoint_path(self, trial_id: str, resource: int) -> str:
        suffix = registry.get(self.settings.model).checkpoint_suffix
        path = Path(self.job_dir) / "checkpoints" / trial_id / f"r{resource}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return str(path)
