"""Whole jobs on a local MLflow store: each child run's ``best_<metric>`` agrees with the job's best, and ``@champion``
stays on the better version of two jobs on the same data and metric (``@challenger`` on the other) unless forced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow_runs import runs_of  # tests/flows

pytestmark = pytest.mark.usefixtures("prefect_harness")

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


def log_model(checkpoint_dir: str, tags: dict[str, str] | None = None) -> Any:
    """The jobs' model in MLflow's pyfunc flavour (a constant): the trainer's ``log_model`` beside it, so each job
    registers a version (``trainers.function``)."""
    import mlflow

    class Constant(mlflow.pyfunc.PythonModel):
        def predict(self, model_input: list[str], params: dict | None = None) -> list[str]:
            return model_input

    return mlflow.pyfunc.log_model(name="model", python_model=Constant(), pip_requirements=[], tags=tags)


def _scored(level: float) -> Callable[[Any], dict[str, float]]:
    """A job whose best score lies in [level, level + 0.01]: two levels 0.1 apart never tie."""
    def train(trial) -> dict[str, float]:
        return {"score": level + 0.01 * trial.config["x"] * trial.resource / 3}
    return train


def test_two_jobs_on_the_same_data_keep_the_better_as_champion_and_force_champion_moves_it(tracking_uri, tmp_path):
    import prefect_hyperband as hb

    def job(level: float, **options: Any):
        result = hb.tune(_scored(level), space=SPACE, metric="score", direction="maximize", max_resource=3, eta=3,
                         seed=1, job_dir=str(tmp_path / "jobs"), experiment="champ", **options)
        client, parent, _ = runs_of(tracking_uri, "champ", result.parent_run_id)
        text = Path(client.download_artifacts(parent.info.run_id, "summary.txt", str(tmp_path))).read_text()
        tags = parent.data.tags
        return result, int(tags["hyperband.champion_version"]), tags["hyperband.model_alias"], text

    def aliases() -> dict[str, int]:
        from mlflow import MlflowClient

        return {a: int(v) for a, v in MlflowClient(tracking_uri).get_registered_model("champ").aliases.items()}

    better, first, alias, _ = job(0.9)
    assert alias == "champion" and aliases() == {"champion": first}
    worse, second, alias, text = job(0.8)
    assert worse.best_score < better.best_score
    assert alias == "challenger" and aliases() == {"champion": first, "challenger": second}
    # the summary names the champion kept and this job's version
    assert any(f"version {first}" in line and f"version {second}" in line for line in text.splitlines())
    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri).get_model_version("champ", str(first)).tags
    assert float(tags["hyperband.score"]) == pytest.approx(better.best_score) and tags["hyperband.metric"] == "score"
    _, third, alias, _ = job(0.7, force_champion=True)
    assert alias == "champion" and aliases()["champion"] == third


def _curve(trial) -> dict[str, float]:
    """A loss best at r=1 for x < 0.5, at R for x > 0.5: a run's last value is not its best."""
    return {"loss": trial.config["x"] + (0.5 - trial.config["x"]) * (trial.resource - 1) / 4}


def test_each_child_runs_best_metric_is_its_best_over_its_rungs_and_the_best_child_is_the_jobs_best(tracking_uri,
                                                                                                   tmp_path):
    import prefect_hyperband as hb

    result = hb.tune(_curve, space=SPACE, metric="loss", direction="minimize", max_resource=9, eta=3, seed=2,
                     job_dir=str(tmp_path / "jobs"), experiment="curve", register_model=False)
    client, parent, children = runs_of(tracking_uri, "curve", result.parent_run_id)
    assert len(children) == result.summary["configs"]
    bests = {}
    for child in children:
        points = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "loss")}
        best_resource = min(points, key=lambda r: (points[r], r))  # ties to the smaller resource, as the job's
        assert child.data.metrics["best_loss"] == pytest.approx(points[best_resource])
        assert child.data.tags["hyperband.best_resource"] == str(best_resource)
        assert len(client.get_metric_history(child.info.run_id, "best_loss")) == len(points)  # each rung's
        bests[child.data.tags["hyperband.trial_id"]] = child.data.metrics["best_loss"]
    assert any(c.data.metrics["best_loss"] != c.data.metrics["loss"] for c in children)  # the curve did its part
    assert min(bests, key=lambda t: (bests[t], t)) == result.best_trial
    assert min(bests.values()) == pytest.approx(result.best_score) == pytest.approx(parent.data.metrics["best_loss"])
