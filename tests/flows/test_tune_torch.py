"""--model torch: DistributedDataParallel trials inside the Hyperband job, tracked like XGBoost."""

from __future__ import annotations

import numpy as np
import pytest

from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.trainers.data import DataSpec, load

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.slow
def test_ddp_trials_on_digits_with_two_workers(tracking_uri, tmp_path):
    from mlflow import MlflowClient

    from prefect_hyperband.flows.tune import tune

    result = tune(TuneParams(model="torch", data="digits", workers=2, min_resource=1, max_resource=3, eta=3,
                             job_dir=str(tmp_path / "jobs"), experiment="ddp", baseline=False))
    summary = result["summary"]
    assert (summary["configs"], summary["trial_rungs"], summary["reached_max_resource"]) == (5, 6, 3)
    assert summary["resource_used"] == 3 * 1 + 1 * 2 + 2 * 3
    assert summary["failed_trials"] == 0 and summary["best_score"] > 0.85

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("ddp")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(kids) == 5
    for kid in kids:
        p = kid.data.params
        assert p["workers"] == "2" and int(p["global_batch_size"]) == 2 * int(p["per_replica_batch_size"])
        assert {"lr", "weight_decay", "width", "dropout", "momentum"} <= set(p)
    winner = next(k for k in kids if k.data.tags["hyperband.status"] == "completed" and k.data.tags["hyperband.bracket"] == "1")
    # per-epoch metrics at step = epoch, continuing across the resume (1, then 2..3)
    assert [m.step for m in client.get_metric_history(winner.info.run_id, "val_accuracy")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(winner.info.run_id, "train_loss")] == [1, 2, 3]
    assert client.get_metric_history(winner.info.run_id, "startup_seconds")

    import mlflow

    model = mlflow.pyfunc.load_model("models:/ddp@champion")
    data = load(DataSpec("digits"))
    probabilities = np.asarray(model.predict(data.X_val[:50]))
    assert probabilities.shape == (50, 10)
    assert (probabilities.argmax(axis=1) == data.y_val[:50]).mean() > 0.8
