"""``executors.result.Outcome``: one trial-rung's result, whole, and what MLflow and the state get of it."""

from __future__ import annotations

from prefect_hyperband.executors.result import Outcome
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.base import Evaluation, TrainResult

RUNG = TrialRung(trial_id="s1-0002", bracket=1, rung=1, resource=3, config={"x": 1.0}, checkpoint="r1")


def test_mlflows_batch_holds_the_metric_the_seconds_the_trainers_figures_and_the_other_objectives():
    trained = TrainResult("r3", 3, 2, 4.0, 2, history=[{"step": 2, "train_loss": 0.5}],
                          info={"startup_seconds": 1.5, "note": "text", "worker": "gpu-7:42"})
    out = Outcome(RUNG, trained, Evaluation((0.2, 4.0), 0.1, {"val_loss": 0.2, "train_seconds": 4.0,
                                                              "predict_ms": 3.0}), None, 10.0, 15.0)
    history, metrics, tags = out.batch("val_loss")
    assert history == [{"step": 2, "train_loss": 0.5}]
    assert metrics == {"train_seconds": 4.0, "worker_seconds": 8.0, "startup_seconds": 1.5, "predict_ms": 3.0,
                       "val_loss": 0.2}  # the first objective is the metric; text is not a metric
    assert tags == {"hyperband.worker": "gpu-7:42"}
    row = out.row()
    assert (row.trial_id, row.resource, row.resource_trained, row.score, row.workers) == ("s1-0002", 3, 2, 0.2, 2)
    assert (row.train_seconds, row.eval_seconds, row.started, row.ended) == (4.0, 0.1, 10.0, 15.0)


def test_a_metric_the_history_holds_at_its_step_is_not_logged_twice_and_a_failure_logs_nothing_it_trained():
    trained = TrainResult("r3", 3, 2, 4.0, 1, history=[{"step": 3, "val_loss": 0.3}])
    _, metrics, _ = Outcome(RUNG, trained, Evaluation(0.3, 0.1), None).batch("val_loss")
    assert "val_loss" not in metrics and metrics["train_seconds"] == 4.0
    history, metrics, tags = Outcome(RUNG, trained, None, "ValueError: nan loss").batch("val_loss")
    assert (history, metrics, tags) == ([], {}, {})
    assert Outcome(RUNG, None, None, "boom").row().score is None
