"""Several objectives end to end: promotion by fronts, the front in MLflow, the champion per --select."""

from __future__ import annotations

import json

import pytest
from mlflow_runs import runs_of  # tests/flows

from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.hyperband import front, pareto
from prefect_hyperband.hyperband.promotion import promote

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_two_objectives_front_hypervolume_tags_and_knee_champion_in_mlflow(tracking_uri, tmp_path):
    """Also MLflow's own conventions: the experiment's kind and primary metric, datasets, the champion's metrics."""
    from prefect_hyperband.flows.tune import tune

    result = tune(TuneParams(data="breast-cancer", max_resource=9, eta=3, seed=0, sampler="tpe",
                             metric=["val_auc:max", "predict_ms:min"], select="knee", baseline=False,
                             job_dir=str(tmp_path / "jobs"), experiment="mo"))
    summary = result["summary"]
    assert summary["trial_rungs"] == 22 and summary["failed_trials"] == 0
    assert list(summary["objectives"]) == ["val_auc", "predict_ms"]
    assert f"{summary['front_size']} configs on the Pareto front of val_auc, predict_ms" in result["table"]

    client, parent, children = runs_of(tracking_uri, "mo", result["parent_run_id"])
    run_of = {c.data.tags["hyperband.trial_id"]: c for c in children}
    for child in children:  # every trial-rung logged its objectives and costs
        assert {"val_auc", "predict_ms", "model_bytes", "train_seconds"} <= set(child.data.metrics)

    # promotion: bracket s=2's rung 0 (9 trials at r=1) sent up the top 3 of the fronts of their (auc, ms)
    def at(trial: str, key: str, step: int) -> float:
        return next(m.value for m in client.get_metric_history(run_of[trial].info.run_id, key) if m.step == step)

    rung0 = {t: (at(t, "val_auc", 1), at(t, "predict_ms", 1)) for t in run_of if t.startswith("s2-")}
    assert len(rung0) == 9
    went_up = {t for t, c in run_of.items() if t.startswith("s2-") and int(c.data.tags["hyperband.resource"]) >= 3}
    assert went_up == set(promote(rung0, 3, ("max", "min")))

    # the front's table and plot on the parent run; each child's front rank as a tag
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"pareto_front.json", "pareto_front.png"} <= artifacts
    raw = json.loads(open(client.download_artifacts(parent.info.run_id, "pareto_front.json", str(tmp_path))).read())
    table = [dict(zip(raw["columns"], row)) for row in raw["data"]]
    assert len(table) == summary["configs"]
    assert sum(r["front_rank"] == 0 for r in table) == summary["front_size"] == parent.data.metrics["pareto_front_size"]
    for r in table:
        assert run_of[r["trial_id"]].data.tags["hyperband.front_rank"] == str(r["front_rank"])
    values = {r["trial_id"]: (r["val_auc"], r["predict_ms"]) for r in table}
    assert pareto.front_ranks(values, ("max", "min")) == {r["trial_id"]: r["front_rank"] for r in table}

    # the hypervolume after each trial-rung, its last value the front's against the stated reference
    history = sorted(client.get_metric_history(parent.info.run_id, "hypervolume"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(1, 23))
    tag = parent.data.tags["hyperband.hypervolume_reference"]
    ref = tuple(float(part.split("=")[1]) for part in tag.split(", "))
    on_front = [v for t, v in values.items() if next(r for r in table if r["trial_id"] == t)["front_rank"] == 0]
    assert history[-1].value == pytest.approx(pareto.hypervolume(on_front, ref, ("max", "min")), rel=1e-6)  # the table keeps 10 digits

    # the champion is the front's knee, registered with its alias
    points = [front.Point(r["trial_id"], r["resource"], values[r["trial_id"]], 0) for r in table if r["front_rank"] == 0]
    knee, _ = front.choose(points, ("max", "min"), ["val_auc", "predict_ms"], ("knee",))
    assert result["best"]["trial_id"] == knee.trial_id
    version = client.get_model_version_by_alias("mo", "champion")
    assert version.run_id == run_of[knee.trial_id].info.run_id

    # MLflow's conventions (issue 28): the Model training kind, the primary metric, datasets, the linked champion
    tags = client.get_experiment(parent.info.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["mlflow.experiment.primaryMetric.name"] == "val_auc"
    assert tags["mlflow.experiment.primaryMetric.greaterIsBetter"] == "true"
    digests = set()
    for run in [parent, *children]:
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        contexts = {i.tags[0].value: i.dataset for i in inputs}
        assert set(contexts) == {"training", "validation"}
        assert contexts["training"].name == "breast-cancer (training)"
        assert json.loads(contexts["validation"].profile)["num_rows"] == 114  # 20% of 569
        digests.add((contexts["training"].digest, contexts["validation"].digest))
    assert len(digests) == 1  # one job, one version of its data
    [output] = client.get_run(parent.info.run_id).outputs.model_outputs  # the parent lists the champion
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == run_of[knee.trial_id].info.run_id
    linked = {m.key: m for m in logged.metrics}
    assert set(linked) == {"val_auc", "predict_ms"}
    assert linked["val_auc"].value == pytest.approx(values[knee.trial_id][0])
    assert linked["val_auc"].dataset_digest == next(iter(digests))[1]  # measured on the validation set


def test_a_user_function_with_two_objectives_promotes_by_both(tracking_uri, tmp_path):
    """``hb.tune(metrics=...)``: the function's own two numbers rank its rungs; a missing one fails the trial."""
    import prefect_hyperband as hb

    def train(trial: hb.Trial) -> dict[str, float]:
        x = trial.config["x"]
        if x > 0.8:
            return {"loss": x}  # no size: its trials fail, naming the objective
        return {"loss": (1 - x) / trial.resource, "size": x * 100}  # loss and size pull against each other

    result = hb.tune(train, space={"x": {"type": "float", "low": 0.0, "high": 1.0}},
                     metrics={"loss": "min", "size": "min"}, max_resource=9, eta=3, seed=3,
                     job_dir=str(tmp_path / "jobs"), experiment="fn2", baseline=False)
    client, parent, children = runs_of(tracking_uri, "fn2", result.parent_run_id)
    failed = [c for c in children if c.data.tags["hyperband.status"] == "failed"]
    assert failed and all("objective(s) size not reported" in c.data.tags["hyperband.error"] for c in failed)
    finite = {c.data.tags["hyperband.trial_id"]: (c.data.metrics["loss"], c.data.metrics["size"])
              for c in children if c not in failed}  # the latest values: each trial at its highest rung
    ranks = pareto.front_ranks(finite, ("min", "min"))
    assert {t: int(c.data.tags["hyperband.front_rank"]) for c in children if (t := c.data.tags["hyperband.trial_id"])
            in finite} == ranks
    assert result.summary["front_size"] == sum(r == 0 for r in ranks.values()) > 1
    assert parent.data.tags["hyperband.objectives"] == "loss:min, size:min"
