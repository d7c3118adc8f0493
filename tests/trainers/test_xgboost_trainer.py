from __future__ import annotations

import numpy as np
import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.xgboost.config import DEFAULT_CONFIG, segments
from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

CONFIG = {"eta": 0.1, "max_depth": 5, "colsample_bytree": 0.7, "colsample_bylevel": 0.8, "alpha": 0.1, "min_child_weight": 2.0}
MILESTONES = (1, 3, 9, 27)


@pytest.fixture(scope="module")
def local():
    trainer = XGBoostTrainer(DataSpec(), workers=1, seed=3, milestones=MILESTONES, nthread=2)
    yield trainer
    trainer.close()


def test_segments_split_at_milestones():
    assert segments(0, 9, MILESTONES) == [(0, 1), (1, 3), (3, 9)]
    assert segments(3, 27, MILESTONES) == [(3, 9), (9, 27)]
    assert segments(0, 5, ()) == [(0, 5)]


def test_resume_3_then_9_equals_9_at_once(local, tmp_path):
    """Column sampling on: the per-segment seeds make the resumed model identical, bit for bit."""
    at_once = local.train(CONFIG, 9, None, str(tmp_path / "a9.ubj"))
    three = local.train(CONFIG, 3, None, str(tmp_path / "b3.ubj"))
    resumed = local.train(CONFIG, 9, three.checkpoint, str(tmp_path / "b9.ubj"))
    assert (at_once.resource_trained, three.resource_trained, resumed.resource_trained) == (9, 3, 6)
    X = local.data.X_val
    np.testing.assert_array_equal(local.predict(at_once.checkpoint, X), local.predict(resumed.checkpoint, X))
    assert local.booster(resumed.checkpoint).num_boosted_rounds() == 9 * local.rounds_per_unit


def test_the_model_train_returns_is_the_one_measured_without_loading_its_checkpoint(local, tmp_path, monkeypatch):
    """The trained booster goes to ``measure`` as a value of the train result (no thread-local, no reload); it is left
    out of the result's JSON (a remote trial-rung's) and of its equality."""
    trained = local.train(CONFIG, 3, None, str(tmp_path / "m3.ubj"))
    assert trained.model is not None and "model" not in trained.to_json()
    loaded = local.measure(trained.checkpoint)
    monkeypatch.setattr(local, "booster", lambda checkpoint: pytest.fail("the checkpoint was loaded again"))
    assert local.measure(trained.checkpoint, trained.model)[0] == loaded[0]
    from dataclasses import replace

    assert replace(trained, model=None) == trained


def test_resume_never_retrains_from_scratch(local, tmp_path):
    three = local.train(CONFIG, 3, None, str(tmp_path / "c3.ubj"))
    with pytest.raises(ValueError, match="must exceed the checkpoint's 3"):
        local.train(CONFIG, 3, three.checkpoint, str(tmp_path / "c3b.ubj"))
    before = local.booster(three.checkpoint).get_dump()
    resumed = local.booster(local.train(CONFIG, 9, three.checkpoint, str(tmp_path / "c9.ubj")).checkpoint).get_dump()
    assert resumed[: len(before)] == before  # the first 30 trees are the checkpoint's, untouched


def test_the_training_matrix_is_built_once_per_trial_at_once_not_per_trial_rung(tmp_path):
    """Each trial-rung runs in a thread of its own (``executors.threads``): the matrices are kept by the trainer,
    one per trial trained at once, whichever thread takes one next."""
    import threading

    trainer = XGBoostTrainer(DataSpec(data="breast-cancer"), seed=3, milestones=MILESTONES, nthread=1)
    for i in range(3):  # one after another, each in a new thread
        thread = threading.Thread(target=trainer.train, args=(CONFIG, 1, None, str(tmp_path / f"s{i}.ubj")))
        thread.start()
        thread.join()
    assert trainer.matrices_built == 1
    gate, inside = threading.Barrier(2), []

    def two_at_once(i: int) -> None:
        with trainer._dtrain_local() as dtrain:
            inside.append(dtrain)
            gate.wait(timeout=30)  # both hold one at the same time: never the same

    threads = [threading.Thread(target=two_at_once, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert trainer.matrices_built == 2 and inside[0] is not inside[1]
    trainer.close()


def test_tuned_config_beats_default_on_bank_marketing(local, tmp_path):
    tuned = local.evaluate(local.train(CONFIG, 9, None, str(tmp_path / "t.ubj")).checkpoint)
    default = local.evaluate(local.train(DEFAULT_CONFIG, 9, None, str(tmp_path / "d.ubj")).checkpoint)
    assert tuned > 0.79 and tuned > default


def test_unknown_parameters_are_rejected(local, tmp_path):
    with pytest.raises(InputError, match="unknown XGBoost parameter"):
        local.train({"colour": 1}, 1, None, str(tmp_path / "x.ubj"))


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_one_and_two_dask_workers_agree(local, tmp_path):
    """Allreduce over a 2-process LocalCluster: same data, AUC within 0.01 of in-process training."""
    from prefect_hyperband.executors.dask_xgboost import xgboost_on

    distributed = XGBoostTrainer(DataSpec(), workers=2, seed=3, milestones=MILESTONES, nthread=2,
                                 placement=xgboost_on(None))
    try:
        assert distributed.workers == 2
        assert len(distributed.worker_groups.groups) == 1 and len(distributed.worker_groups.groups[0]) == 2
        two = distributed.evaluate(distributed.train(CONFIG, 3, None, str(tmp_path / "w2.ubj")).checkpoint)
        one = local.evaluate(local.train(CONFIG, 3, None, str(tmp_path / "w1.ubj")).checkpoint)
        assert abs(two - one) < 0.01
        # the data went onto the cluster once; a second trial reuses it and resumes across workers too
        resumed = distributed.train(CONFIG, 9, str(tmp_path / "w2.ubj"), str(tmp_path / "w2-9.ubj"))
        assert resumed.resource_trained == 6 and resumed.workers == 2
    finally:
        distributed.close()
