"""The MLflow runs a job left: shared by the flow tests (tests/flows is on sys.path, as pytest runs them)."""

from __future__ import annotations


def runs_of(uri: str, experiment: str, parent_run_id: str):
    """(client, the job's parent run, its child runs) in ``experiment`` of the store at ``uri``."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=2000)
    parent = next((r for r in runs if r.info.run_id == parent_run_id), None)
    return client, parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run_id]
