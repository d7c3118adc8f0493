"""MLflow's conventions for the job's experiment: its kind and its primary metric."""

from __future__ import annotations

from prefect_hyperband.tracking import runs as tracking


def test_a_new_experiment_is_model_development_with_the_jobs_primary_metric(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id, note = tracking.model_development(uri, "new", "val_loss", greater_is_better=False)
    tags = tracking.client(uri).get_experiment(exp_id).tags
    assert note is None
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["mlflow.experiment.primaryMetric.name"] == "val_loss"
    assert tags["mlflow.experiment.primaryMetric.greaterIsBetter"] == "false"


def test_an_experiment_with_no_kind_is_tagged_and_one_of_another_kind_left_as_it_is(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    plain = c.create_experiment("plain", tags={"mlflow.experiment.primaryMetric.name": "mine"})
    genai = c.create_experiment("genai", tags={"mlflow.experimentKind": "genai_development"})
    assert tracking.model_development(uri, "plain", "val_auc", True) == (plain, None)
    tags = c.get_experiment(plain).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["mlflow.experiment.primaryMetric.name"] == "mine"  # the user's choice stays
    exp_id, note = tracking.model_development(uri, "genai", "val_auc", True)
    assert exp_id == genai and "of kind 'genai_development'; left as it is" in note
    assert c.get_experiment(genai).tags["mlflow.experimentKind"] == "genai_development"
    assert "mlflow.experiment.primaryMetric.name" not in c.get_experiment(genai).tags


def test_a_table_logged_again_replaces_the_last_one_and_shows_as_a_table(tracking_uri, tmp_path):
    """MLflow's own ``log_table`` appends to a table already there: the live importances (every 10 s) and a resumed
    job's leaderboard grew a copy per write. Ours replaces it."""
    import json

    c = tracking.client(tracking_uri)
    run_id = c.create_run(c.create_experiment("tables")).info.run_id
    tracking.log_table(tracking_uri, run_id, [{"param": "x", "importance": 0.4}], "importance.json")
    tracking.log_table(tracking_uri, run_id, [{"param": "x", "importance": 0.7}, {"param": "y", "importance": 0.3}],
                       "importance.json")
    tracking.log_table(tracking_uri, run_id, [{"rank": 1}], "tables/leaderboard.json")
    table = json.loads((tmp_path / c.download_artifacts(run_id, "importance.json", str(tmp_path))).read_text())
    assert table["columns"] == ["param", "importance"]
    assert table["data"] == [["x", 0.7], ["y", 0.3]]
    shown = json.loads(c.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert shown == [{"path": "importance.json", "type": "table"}, {"path": "tables/leaderboard.json", "type": "table"}]
