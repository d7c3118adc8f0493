"""TorchTrainer: DDP gradient averaging, exact resume, failure handling, digits accuracy.

Every ``train`` call launches real processes through ``torch.distributed.run`` (a few seconds each).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from faulty_torch import Fault, FaultyTorchTrainer, SmallTorchTrainer
from torch_helpers import max_difference, torch_descendants, torch_processes

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.launch import processes_with
from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG, DEFAULT_SPACE, PARAMS, resolve_config
from prefect_hyperband.trainers.torch.ddp import TorchTrainer, load_model, predict

DIGITS = DataSpec("digits")
#: plain SGD steps that two replicas can reproduce exactly: no dropout, no lr scaling or warm-up
PLAIN = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "dropout": 0.0, "lr_scaling": "none", "warmup_epochs": 0}


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    """DEFAULT_CONFIG at 2 workers on digits: 3 epochs then resumed to 9, and 9 epochs at once (in parallel)."""
    root = tmp_path_factory.mktemp("torch-resume")
    trainer = TorchTrainer(DIGITS, workers=2, warm=False, threads_per_rank=1)
    with ThreadPoolExecutor(2) as pool:
        full_future = pool.submit(trainer.train, DEFAULT_CONFIG, 9, None, str(root / "full.pt"))
        first = trainer.train(DEFAULT_CONFIG, 3, None, str(root / "first.pt"))
        resumed = trainer.train(DEFAULT_CONFIG, 9, first.checkpoint, str(root / "resumed.pt"))
        full = full_future.result()
    return trainer, first, resumed, full


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_gradient_averaging_two_replicas_equal_one_with_double_batch(tmp_path):
    """World size 2 x per-replica batch 32 == world size 1 x batch 64 after one epoch (also: two concurrent calls)."""
    rows = 1280  # divisible by 64: every batch is full on both sides
    one = SmallTorchTrainer(DIGITS, workers=1, warm=False, threads_per_rank=1, max_train_rows=rows)
    two = SmallTorchTrainer(DIGITS, workers=2, warm=False, threads_per_rank=1, max_train_rows=rows)
    with ThreadPoolExecutor(2) as pool:  # train runs in worker threads, two at once, as under Prefect
        a = pool.submit(one.train, {**PLAIN, "batch_size": 64}, 1, None, str(tmp_path / "one.pt"))
        b = pool.submit(two.train, {**PLAIN, "batch_size": 32}, 1, None, str(tmp_path / "two.pt"))
        r1, r2 = a.result(), b.result()
    assert r1.info["global_batch_size"] == r2.info["global_batch_size"] == 64
    assert r2.info["world_size"] == 2 and r2.info["per_replica_batch_size"] == 32
    assert max_difference(weights(r1.checkpoint), weights(r2.checkpoint)) < 1e-5
    assert r1.history[0]["train_loss"] == pytest.approx(r2.history[0]["train_loss"], rel=1e-5)
    assert r2.history[0]["val_accuracy"] > 0.5  # it did learn something


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_resume_equals_training_at_once(digits_runs):
    trainer, first, resumed, full = digits_runs
    assert (first.resource, first.resource_trained) == (3, 3)
    assert (resumed.resource, resumed.resource_trained) == (9, 6)
    assert [h["step"] for h in resumed.history] == [4, 5, 6, 7, 8, 9]
    assert [h["step"] for h in full.history] == list(range(1, 10))
    assert max_difference(weights(resumed.checkpoint), weights(full.checkpoint)) < 1e-6
    assert resumed.history[-1]["val_accuracy"] == pytest.approx(full.history[-1]["val_accuracy"])
    assert json.loads(Path(resumed.checkpoint + ".json").read_text()) == {"resource": 9,
                                                                          "bytes": Path(resumed.checkpoint).stat().st_size}
    # nothing to train: the checkpoint is passed on, no processes started
    again = trainer.train(DEFAULT_CONFIG, 9, resumed.checkpoint, resumed.checkpoint + ".copy")
    assert again.resource_trained == 0 and max_difference(weights(again.checkpoint), weights(full.checkpoint)) == 0
    with pytest.raises(InputError, match="below"):
        trainer.train(DEFAULT_CONFIG, 2, resumed.checkpoint, resumed.checkpoint + ".x")


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_digits_default_config_two_workers_reaches_95_percent(digits_runs):
    trainer, _, _, full = digits_runs
    assert full.history[-1]["val_accuracy"] >= 0.95
    assert trainer.evaluate(full.checkpoint) == pytest.approx(full.history[-1]["val_accuracy"])
    info = full.info
    assert info["world_size"] == 2 and info["global_batch_size"] == 2 * DEFAULT_CONFIG["batch_size"]
    assert info["effective_lr"] == pytest.approx(2 * DEFAULT_CONFIG["lr"])
    assert 0 < info["startup_seconds"] < full.seconds and info["train_seconds"] > 0
    # the model the tracker will log: raw rows in, probabilities out
    X = trainer.data.X_val[:5]
    proba = predict(full.checkpoint, X)
    assert proba.shape == (5, 10) and np.allclose(proba.sum(axis=1), 1.0)
    model = load_model(full.checkpoint)
    assert not model.training
    with torch.no_grad():
        assert np.allclose(model(torch.from_numpy(X)).numpy(), proba, atol=1e-6)


@pytest.mark.slow  # two cold ranks
def test_a_cold_rank_aborting_after_its_work_keeps_the_result_with_the_rank_named(tmp_path):
    """Issue 79: rank 0 aborts at exit (SIGABRT after destroy_process_group()), its checkpoint and result written."""
    trainer = FaultyTorchTrainer(DIGITS, workers=2, warm=False, threads_per_rank=1, max_train_rows=256)
    trained = trainer.train({}, 2, None, str(tmp_path / "r2.pt"), fault=Fault(rank=0, how="abort_at_exit"))
    assert trained.resource == 2 and [row["step"] for row in trained.history] == [1, 2]
    assert trained.info["exit_race_rank"] == 0.0 and trained.info["exit_code"] == -6.0
    assert trained.info["exit_kept"].startswith("rank 0 exited with code -6 (SIGABRT) after rank 0 reported r=2")
    assert trainer.train({}, 3, trained.checkpoint, str(tmp_path / "r3.pt")).resource_trained == 1


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_killed_rank_fails_only_its_call_fast_and_leaves_no_processes(tmp_path):
    before = torch_processes(os.getpid())  # what an earlier test of this xdist worker left running
    scratch = tmp_path / "failing"
    scratch.mkdir()
    failing = FaultyTorchTrainer(DIGITS, workers=2, warm=False, threads_per_rank=1, max_train_rows=256, scratch_dir=str(scratch))
    healthy = SmallTorchTrainer(DIGITS, workers=1, warm=False, threads_per_rank=1, max_train_rows=256)
    with ThreadPoolExecutor(1) as pool:
        neighbour = pool.submit(healthy.train, {}, 3, None, str(tmp_path / "neighbour.pt"))
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"(?s)failed rank.*1.*injected failure \(exit\) at rank 1, epoch 2"):
            failing.train({}, 4, None, str(tmp_path / "crash.pt"), fault=Fault(rank=1, epoch=2, how="exit"))
        assert time.monotonic() - started < 60
        assert processes_with(str(scratch)) == []
        assert neighbour.result().resource == 3  # the concurrent call was unaffected
    assert not (tmp_path / "crash.pt").exists() and list(scratch.iterdir()) == []
    after = failing.train({}, 1, None, str(tmp_path / "after.pt"))  # the trainer still works
    assert after.resource == 1
    assert torch_descendants(os.getpid(), besides=before) == []


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_hanging_rank_is_killed_at_the_trial_timeout(tmp_path):
    before = torch_processes(os.getpid())
    trainer = FaultyTorchTrainer(DIGITS, workers=2, warm=False, threads_per_rank=1, max_train_rows=256, trial_timeout=8)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 8 s"):
        trainer.train({}, 2, None, str(tmp_path / "hang.pt"), fault=Fault(rank=0, how="hang"))
    assert time.monotonic() - started < 8 + 15
    assert torch_descendants(os.getpid(), besides=before) == []
    trainer.close()
    trainer.close()  # idempotent


def test_config_validation_and_launch_command():
    assert set(DEFAULT_SPACE) <= PARAMS and set(DEFAULT_CONFIG) <= PARAMS
    assert resolve_config({"batch_size": 32.0, "width": np.int64(16)})["batch_size"] == 32
    for bad, rule in [
        ({"lr": 0}, "lr must be > 0"),
        ({"batch_size": 1.5}, "batch_size must be an integer"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"lr_scaling": "sqrt"}, "lr_scaling must be one of linear, none"),
        ({"learning_rate": 0.1}, "unknown torch hyperparameter"),
        ({"_fail_rank": 0, "_fail_how": "hang"}, "unknown torch hyperparameter"),  # no fault through a config
    ]:
        with pytest.raises(InputError, match=rule):
            resolve_config(bad)
    with pytest.raises(InputError, match="does not fit"):
        TorchTrainer(DIGITS, metric="rmse")
    single = TorchTrainer(DIGITS, workers=2).launch_command("/tmp/job.json")
    assert single[single.index("--rdzv-endpoint") + 1] == "127.0.0.1:0" and "--max-restarts" in single
    assert single[single.index("--nnodes") + 1] == "1" and single[single.index("--nproc-per-node") + 1] == "2"
    with pytest.raises(TypeError):  # across machines is the Dask path (dask_address), not torchrun's --nnodes
        TorchTrainer(DIGITS, nnodes=2, rdzv_endpoint="head:29400")
