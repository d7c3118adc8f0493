"""Models are plug-ins: the built-ins come from trainers/plugins/, one file each; another registers the same way."""

from __future__ import annotations

import pytest

from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.errors import InputError


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
    from prefect_hyperband.flows.prepare import prepare
    from prefect_hyperband.flows.params import TuneParams
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
