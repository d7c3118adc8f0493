"""Models are plug-ins: the built-ins come from trainers/plugins/, one file each; another registers the same way."""

from __future__ import annotations

import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import registry


def test_the_built_ins_and_user_code_are_registry_entries():
    assert registry.names()[:5] == ("xgboost", "torch", "synthetic", "function", "script")
    assert registry.built_in() == ("xgboost", "torch", "synthetic")
    assert registry.user_code_fields() == {"trainer": "function", "script": "script"}
    xgb = registry.get("xgboost")
    space, known, default = xgb.space()
    assert "eta" in space and "eta" in known and default["max_depth"] == 6
    assert xgb.checkpoint_suffix == ".ubj" and xgb.log_model is not None and xgb.local_workers
    assert registry.get("function").metric is None and registry.get("function").user_code == "trainer"
    with pytest.raises(InputError, match="unknown model 'lightgbm'"):
        registry.get("lightgbm")


def test_a_new_model_is_one_registration_and_runs_through_the_job(tmp_path, monkeypatch):
    """A model registered from outside (as an entry point would) is a choice of TuneParams' checks and builds its trainer."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.prepare import prepare
    from prefect_hyperband.trainers import factory
    from prefect_hyperband.trainers.synthetic_trainer import SyntheticTrainer

    built = []

    def build(settings):
        built.append(settings)
        return SyntheticTrainer(seed=settings.seed)

    model = registry.Model("toy", build, "a toy", space=registry.get("synthetic").space,
                           metric=lambda spec, given: "loss", checkpoint_suffix=".toy")
    monkeypatch.setitem(registry._models, "toy", model)
    params = TuneParams.model_construct(**{**TuneParams().model_dump(), "model": "toy", "max_resource": 3,
                                           "job_dir": str(tmp_path), "tracking_uri": f"sqlite:///{tmp_path}/m.db"})
    job = prepare(params)
    assert job.metric == "loss" and job.metric_key == "val_loss"
    assert job.checkpoint_path("t", 1).endswith("r1.toy")
    assert isinstance(factory.build(job.settings), SyntheticTrainer) and built[-1].model == "toy"


def test_a_user_log_model_hook_gets_the_jobs_tags_when_it_takes_them_else_they_are_set_after(tracking_uri):
    """The user's ``log_model(checkpoint_dir, tags=None)`` passes the job's tags to its flavour: the model is born
    with them; a ``log_model(checkpoint_dir)`` without them has its model tagged right after (by the champion's
    writer), as the champion's retry looks for a tagged model."""
    from types import SimpleNamespace

    import mlflow
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from prefect_hyperband.tracking import champion
    from prefect_hyperband.trainers.plugins import user_function

    client = mlflow.MlflowClient(tracking_uri)  # a fresh store of the test's own (conftest)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    model = LogisticRegression().fit(np.eye(4), [0, 1, 0, 1])
    PIP = ["scikit-learn"]  # given: MLflow infers them in a subprocess otherwise (seconds each)
    seen, infos = [], []

    def with_tags(checkpoint_dir, tags=None):
        seen.append((checkpoint_dir, tags))
        infos.append(mlflow.sklearn.log_model(model, name="model", tags=tags, pip_requirements=PIP))
        return infos[-1]

    def without(checkpoint_dir):
        seen.append((checkpoint_dir, None))
        infos.append(mlflow.sklearn.log_model(model, name="model", pip_requirements=PIP))
        return infos[-1]

    plug_in = SimpleNamespace(log_model=user_function.log_model)
    for job_id, hook in (("j1", with_tags), ("j2", without)):
        champion.log_champion(tracking_uri, run_id, plug_in, lambda hook=hook: SimpleNamespace(log_model_hook=hook),
                              "/jobs/j/s0-0001/r9.ckpt", "e", {}, step=9, job_id=job_id)
        tags = {"hyperband.job_id": job_id, "hyperband.resource": "9"}
        assert {k: v for k, v in client.get_logged_model(infos[-1].model_id).tags.items()
                if k.startswith("hyperband.")} == tags
    assert seen == [("/jobs/j/s0-0001/r9", {"hyperband.job_id": "j1", "hyperband.resource": "9"}),
                    ("/jobs/j/s0-0001/r9", None)]
    assert user_function.log_model(SimpleNamespace(log_model_hook=None), "/x/r1.ckpt", tags) is None
