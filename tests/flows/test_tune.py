"""The tuning job under a temporary Prefect server, checked through what lands in MLflow."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.trainers.data import DataSpec, load

pytestmark = pytest.mark.usefixtures("prefect_harness")


def mlflow_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return client, parent, children


@pytest.mark.slow
def test_bank_marketing_1_27_3_end_to_end(tracking_uri, tmp_path):
    """The issue's acceptance job: 49 child runs, 8 reach R, 357 units, AUC ≥ 0.80, champion loads."""
    from prefect_hyperband.flows.tune import tune

    result = tune(TuneParams(max_resource=27, eta=3, seed=0, job_dir=str(tmp_path / "jobs"), experiment="bank"))
    summary = result["summary"]
    assert summary["configs"] == 49 and summary["trial_rungs"] == 69
    assert summary["reached_max_resource"] == 8 and summary["failed_trials"] == 0
    assert summary["resource_used"] == 357 and summary["resource_without_early_stopping"] == 1323
    assert summary["best_score"] >= 0.80
    assert summary["default_score"] < summary["best_score"]

    client, parent, children = mlflow_runs(tracking_uri, "bank")
    assert parent.data.params["min_resource"] == "1" and parent.data.params["max_resource"] == "27"
    assert parent.data.params["eta"] == "3" and parent.data.params["workers"] == "1"
    # the params are the fields marked ``mlflow: param`` (one place), each as the job resolved it
    from prefect_hyperband.flows.params import mlflow_params

    assert set(parent.data.params) == set(mlflow_params()) and parent.data.params["metric"] == "auc"
    assert parent.data.params["unit_seconds"] == "" and parent.data.params["rounds_per_unit"] == "10"
    metrics = parent.data.metrics
    assert metrics["best_val_auc"] == pytest.approx(summary["best_score"])
    assert metrics["resource_used"] == 357 and metrics["resource_without_early_stopping"] == 1323
    assert metrics["worker_seconds"] > 0 and metrics["wall_seconds"] > 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"best_config.json", "summary.json"} <= artifacts
    best_config = json.loads(open(client.download_artifacts(parent.info.run_id, "best_config.json", str(tmp_path))).read())
    assert set(best_config["config"]) == {"eta", "alpha", "min_child_weight", "max_depth", "colsample_bylevel", "colsample_bytree"}

    assert len(children) == 49
    statuses = [c.data.tags["hyperband.status"] for c in children]
    assert statuses.count("completed") == 8 and statuses.count("stopped") == 41
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.params["workers"] == "1" and "eta" in c.data.params for c in children)
    # per-rung metric at step = cumulative resource: the bracket s=3 winner has 1, 3, 9, 27
    winner = next(c for c in children if c.data.tags["hyperband.bracket"] == "3" and c.data.tags["hyperband.status"] == "completed")
    steps = [m.step for m in client.get_metric_history(winner.info.run_id, "val_auc")]
    assert sorted(steps) == [1, 3, 9, 27]  # the champion's link to its logged model adds no point
    assert winner.data.tags["hyperband.highest_rung"] == "3"
    # the default job's data as MLflow datasets: the same training and validation digests on every run
    seen = set()
    for run in [parent, *children]:
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        seen.add(tuple(sorted((i.tags[0].value, i.dataset.name, i.dataset.digest) for i in inputs)))
    [(training, validation)] = seen
    assert training[:2] == ("training", "bank-marketing (training)")
    assert validation[:2] == ("validation", "bank-marketing (validation)")
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"

    import mlflow

    model = mlflow.pyfunc.load_model("models:/bank@champion")
    data = load(DataSpec())
    predictions = np.asarray(model.predict(pd.DataFrame(data.X_val[:20], columns=data.feature_names)))
    assert predictions.shape == (20,) and np.all((predictions >= 0) & (predictions <= 1))


@pytest.mark.slow
def test_two_dask_workers_and_failed_trials_do_not_lose_the_job(tracking_uri, tmp_path):
    """--workers 2 over a LocalCluster; a config XGBoost rejects is refused before any training (its own check, on
    four rows), and a trial that fails in training (a worker's error) fails that trial only."""
    from prefect_hyperband.common.errors import InputError
    from prefect_hyperband.flows.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text("max_depth: {type: categorical, choices: [-1, 3]}\neta: {type: float, low: 0.05, high: 0.3}\n")
    params = dict(max_resource=3, eta=3, seed=1, workers=2, space=str(space), rounds_per_unit=2,
                  job_dir=str(tmp_path / "jobs"), experiment="dask", baseline=False)
    with pytest.raises(InputError, match="search space: max_depth=-1: XGBoost refuses it"):
        tune(TuneParams(**params))
    # a huge max_bin passes XGBoost's check on four rows and fails on the workers' data (its histogram cuts)
    space.write_text("max_bin: {type: categorical, choices: [1000000000, 256]}\neta: {type: float, low: 0.05, high: 0.3}\n")
    result = tune(TuneParams(**params))
    client, parent, children = mlflow_runs(tracking_uri, "dask")
    assert len(children) == 5  # (1, 3, 3): 3 configs at 1, 2 at 3
    bad = [c for c in children if c.data.params["max_bin"] != "256"]
    good = [c for c in children if c.data.params["max_bin"] == "256"]
    assert bad and good, "the seed should draw both kinds of config"
    assert all(c.data.tags["hyperband.status"] == "failed" and c.info.status == "FAILED" for c in bad)
    assert all(c.data.tags["hyperband.status"] in ("completed", "stopped") for c in good)
    assert all(c.data.params["workers"] == "2" for c in children)
    assert result["summary"]["failed_trials"] == len(bad)
    assert parent.data.metrics["best_val_auc"] > 0.7
    assert parent.info.status == "FINISHED"
