"""The job context that tasks receive: small, frozen, made of paths, ids and numbers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from prefect_hyperband.executors.storage import Storage
from prefect_hyperband.hyperband.promotion import Direction, Directions
from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.factory import TrainerSettings


@dataclass(frozen=True)
class Job:
    job_id: str
    job_dir: str
    settings: TrainerSettings
    metric: str
    direction: Direction
    min_resource: int
    max_resource: int
    eta: int
    seed: int
    space: dict[str, dict[str, Any]]
    default_config: dict[str, Any]
    tracking_uri: str
    experiment: str
    concurrency: int
    mode: Literal["hyperband", "asha"] = "hyperband"
    sampler: Literal["random", "tpe", "priorband"] = "random"
    #: train the priors' mode straight to R before the schedule (``hyperband.first.Firsts``)
    prior_first: bool = False
    #: train the default config to R before the schedule, the summary's baseline (``hyperband.first.Firsts``)
    baseline: bool = False
    parent_run_id: str | None = None
    trial_timeout: float | None = None  # seconds a trial-rung may take; None: from the job's measurements
    #: the job's state and checkpoints, ``<--storage>/<job_id>``, when that is a URL (s3://...); None: ``job_dir``
    storage: str | None = None
    #: the Prefect work pool whose workers run the trial-rungs (a ``hyperband-trial`` flow run each); None: here
    trial_pool: str | None = None
    #: trial-rungs as background task runs that ``hyperband worker`` processes take (``flows.task_workers``)
    task_workers: bool = False
    #: with ``task_workers`` and ``--storage``: the storage's root, where the background task runs' parameters travel
    #: (``<root>/task-parameters``; ``hyperband worker --storage`` the same); None: Prefect's task-scheduling storage
    task_storage: str | None = None
    #: with ``task_workers`` and no ``--concurrency``: as many trial-rungs at once as workers serve the job's code now
    follow_workers: bool = False
    #: several objectives: (name in MLflow, direction) each, ``metric_key`` first; (): the one metric
    objectives: tuple[tuple[str, Direction], ...] = ()
    #: several objectives: which point of the Pareto front is the champion (``flows.objectives.parse_select``)
    select: str = "first"
    #: ``--warm-start``: the plan made when the job began (``flows.parents.plan``: parents, kind, note, first configs,
    #: the space with any priors it set); None: a cold job
    warm: dict[str, Any] | None = None

    @property
    def directions(self) -> Directions:
        """What the scheduler ranks by: the metric's direction, or one per objective."""
        return tuple(d for _, d in self.objectives) if self.objectives else self.direction

    def score_of(self, metrics: dict[str, float]) -> float | tuple[float, ...]:
        """A trial-rung's result as the scheduler takes it, from everything it measured (``metric_key`` included)."""
        if not self.objectives:
            return metrics[self.metric_key]
        missing = [name for name, _ in self.objectives if name not in metrics]
        if missing:
            raise ValueError(f"objective(s) {', '.join(missing)} not reported (reported: {', '.join(sorted(metrics))})")
        return tuple(float(metrics[name]) for name, _ in self.objectives)

    @property
    def metric_key(self) -> str:
        """The metric's name in MLflow: ``val_<metric>`` for the built-ins, the user's own name for theirs."""
        return self.metric if registry.get(self.settings.model).metric is None else f"val_{self.metric}"

    def with_parent(self, run_id: str) -> Job:
        return replace(self, parent_run_id=run_id)

    def checkpoint_path(self, trial_id: str, resource: int) -> str:
        """Where this process writes a checkpoint: under the job folder (the storage's mirror when it is a URL)."""
        path = Path(self.job_dir) / self._checkpoint_key(trial_id, resource)
        path.parent.mkdir(parents=True, exist_ok=True)
        return str(path)

    def checkpoint_url(self, trial_id: str, resource: int) -> str:
        """Where that checkpoint is kept: the same path, or its URL under ``storage``."""
        return self.store().url(self._checkpoint_key(trial_id, resource))

    def _checkpoint_key(self, trial_id: str, resource: int) -> str:
        return f"checkpoints/{trial_id}/r{resource}{registry.get(self.settings.model).checkpoint_suffix}"

    def store(self) -> Storage:
        return storage_at(self.storage or self.job_dir, self.job_dir)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (a trial flow run's parameter); ``from_json`` gives the same job back."""
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Job:
        value = dict(value)
        s = dict(value["settings"])
        s["data"] = DataSpec(**{**s["data"], "drop": _tuple(s["data"].get("drop"))})
        s["milestones"] = tuple(s.get("milestones") or ())
        s["extra"] = tuple((k, _tuple(v)) for k, v in s.get("extra") or ())
        if "rounds_per_unit" in s and not dict(s["extra"]).get("rounds_per_unit"):  # a field before 2026-12-01
            s["extra"] += (("rounds_per_unit", s["rounds_per_unit"]),)
        value["settings"] = TrainerSettings(**{k: v for k, v in s.items() if k in _SETTINGS})
        value["objectives"] = _tuple(value.get("objectives") or [])
        return cls(**{f.name: value[f.name] for f in fields(cls) if f.name in value})


#: the fields a ``TrainerSettings`` takes (a job's JSON from another version may hold one it no longer has)
_SETTINGS = frozenset(f.name for f in fields(TrainerSettings))


def _tuple(value: Any) -> Any:
    """JSON lists back to the tuples of a hashable ``TrainerSettings``."""
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


_stores: dict[tuple[str, str], Storage] = {}


def storage_at(root: str, mirror: str) -> Storage:
    """The one ``Storage`` of ``root`` with its local mirror ``mirror`` (made on first use)."""
    store = _stores.get((root, mirror))
    if store is None:
        store = _stores[(root, mirror)] = Storage(root, mirror)
    return store
