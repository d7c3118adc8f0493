"""One trial-rung's result, whole, from the trainer's two calls to MLflow and the job's state: ``Outcome``.

The runner makes it (``flows.runner.work``: the train task's ``TrainResult``, the evaluate task's
``Evaluation``, or the trainer's error); the loop hands it to the scheduler (its score) and to the MLflow writer
whole (``batch``: the child run's metrics, per-unit history and tags, one ``log_batch``), and adds its ``row`` to the
state once MLflow has it. Plain Python: the loop imports it (``executors.loop``), and so does the MLflow writer's
process, which receives it through a pipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect_hyperband.hyperband.accounting import RungResult
from prefect_hyperband.hyperband.promotion import first
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.base import Evaluation, TrainResult


@dataclass(frozen=True)
class Outcome:
    """What one trial-rung gave: trained and evaluated, or the error that ended it (the trainer's)."""

    trial_rung: TrialRung
    trained: TrainResult | None
    evaluated: Evaluation | None
    error: str | None
    started: float | None = None  # epoch seconds: training began, evaluation ended
    ended: float | None = None

    @property
    def score(self) -> float | tuple[float, ...] | None:
        """What the scheduler ranks: the metric, or the objectives' values (several objectives)."""
        return self.evaluated.score if self.evaluated is not None else None

    @property
    def metric(self) -> float | None:
        """The job's metric (of several objectives, the first)."""
        return first(self.score)

    @property
    def checkpoint(self) -> str | None:
        return self.trained.checkpoint if self.trained is not None and self.evaluated is not None else None

    def row(self) -> RungResult:
        """The state's record of it (a row of the job's results: the summary's and the report's)."""
        j, t, e = self.trial_rung, self.trained, self.evaluated
        return RungResult(
            trial_id=j.trial_id, bracket=j.bracket, rung=j.rung, resource=j.resource,
            resource_trained=t.resource_trained if t else 0, train_seconds=t.seconds if t else 0.0,
            eval_seconds=e.seconds if e else 0.0, workers=t.workers if t else 1, score=self.metric,
            started=self.started, ended=self.ended, gpus=int(t.info.get("gpus", 0)) if t else 0,
        )

    def batch(self, metric_key: str) -> tuple[list[dict[str, float]], dict[str, float], dict[str, str]]:
        """MLflow's record of it, for the trial's child run at step = its resource: the per-unit history the trainer
        recorded, the metrics (the metric unless that history holds it at this step; training and worker seconds;
        the trainer's numeric figures; the other objectives' values) and the tags (a remote trial-rung's worker,
        ``hyperband.worker``; a result kept despite a rank's exit code, ``hyperband.exit_kept``). A failed trial-rung's: nothing it trained."""
        trained = self.trained if self.error is None else None
        metrics: dict[str, float] = {}
        history: list[dict[str, float]] = []
        tags: dict[str, str] = {}
        if trained is not None:
            history = trained.history
            metrics = {"train_seconds": trained.seconds, "worker_seconds": trained.seconds * trained.workers}
            metrics.update({k: v for k, v in trained.info.items() if isinstance(v, (int, float))})
            if trained.info.get("worker"):  # a remote trial-rung's machine:pid (``flows.work_pool.outcome_of``)
                tags["hyperband.worker"] = str(trained.info["worker"])
            if trained.info.get("exit_kept"):  # a rank's exit after the work, and why the result stands
                tags["hyperband.exit_kept"] = str(trained.info["exit_kept"])
        measured: dict[str, Any] = self.evaluated.metrics if self.evaluated is not None else {}
        metrics.update({k: v for k, v in measured.items() if k != metric_key})
        score, step = self.metric, self.trial_rung.resource
        if score is not None and not any(row.get("step") == step and metric_key in row for row in history):
            metrics[metric_key] = score  # unless the per-unit history already holds it at this step
        return history, metrics, tags
