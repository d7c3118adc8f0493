"""TorchTrainer's warm pools: same numbers as a cold launch, start-up paid once, failures contained.

A warm pool launches its ranks once (``python -m torch.distributed.run ... --serve DIR``) and
trains later calls on them; these tests compare it with the cold path (``warm=False``).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from faulty_torch import Fault, FaultyTorchTrainer, SmallTorchTrainer
from torch_helpers import max_difference, torch_descendants

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors.torch_pool import warm_pools
from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.factory import TrainerSettings
from prefect_hyperband.trainers.launch import processes_with
from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG
from prefect_hyperband.trainers.torch.ddp import TorchTrainer

DIGITS = DataSpec("digits")
ROWS = 512  # a short epoch: these tests are about processes and numbers, not accuracy


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One warm 2-rank trainer shared by the tests below (its pool launches once)."""
    scratch = tmp_path_factory.mktemp("warm-scratch")
    trainer = FaultyTorchTrainer(DIGITS, workers=2, threads_per_rank=1, max_train_rows=ROWS, scratch_dir=str(scratch),
                                 pools=warm_pools)
    assert trainer.warm  # the default with the pools the torch plug-in gives
    yield trainer
    trainer.close()


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_warm_equals_cold_and_startup_is_paid_once(warm, tmp_path):
    cold = SmallTorchTrainer(DIGITS, workers=2, threads_per_rank=1, max_train_rows=ROWS, warm=False)
    first = warm.train({**DEFAULT_CONFIG, "width": 16, "seed": 5}, 1, None, str(tmp_path / "other.pt"))
    # the pool has trained something else (other width, seed, RNG history): the next call must not notice
    warm_run = warm.train(DEFAULT_CONFIG, 2, None, str(tmp_path / "warm.pt"))
    cold_run = cold.train(DEFAULT_CONFIG, 2, None, str(tmp_path / "cold.pt"))
    assert max_difference(weights(warm_run.checkpoint), weights(cold_run.checkpoint)) < 1e-6
    assert [h["train_loss"] for h in warm_run.history] == pytest.approx([h["train_loss"] for h in cold_run.history])
    assert len(warm.pools) == 1 and warm.pools[0].starts == 1
    assert (first.info["warm_start"], warm_run.info["warm_start"], cold_run.info["warm_start"]) == (0, 1, 0)
    # the launch (processes, torch import, process group, data) is paid by the first call only
    assert first.info["startup_seconds"] > 1.0
    assert warm_run.info["startup_seconds"] < first.info["startup_seconds"] / 10
    assert warm_run.info["startup_seconds"] < 0.5 and cold_run.info["startup_seconds"] > 1.0


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_warm_resume_equals_training_at_once(warm, tmp_path):
    full = warm.train(DEFAULT_CONFIG, 9, None, str(tmp_path / "full.pt"))
    part = warm.train(DEFAULT_CONFIG, 3, None, str(tmp_path / "part.pt"))
    resumed = warm.train(DEFAULT_CONFIG, 9, part.checkpoint, str(tmp_path / "resumed.pt"))
    assert (resumed.resource, resumed.resource_trained) == (9, 6)
    assert [h["step"] for h in resumed.history] == [4, 5, 6, 7, 8, 9]
    assert max_difference(weights(resumed.checkpoint), weights(full.checkpoint)) < 1e-6
    assert resumed.history[-1]["val_accuracy"] == pytest.approx(full.history[-1]["val_accuracy"])
    # the pool's first call may be ``full`` (xdist spreads this module's tests over its workers): the two after it are warm
    assert all(r.info["warm_start"] == 1 for r in (part, resumed))


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_failing_rank_fails_only_its_call_then_the_pool_relaunches(warm, tmp_path):
    warm.train({}, 1, None, str(tmp_path / "before.pt"))
    pool = warm.pools[0]
    pool_dir, starts = str(pool.dir), pool.starts
    with pytest.raises(RuntimeError, match=r"(?s)failed rank.*1.*RuntimeError: injected failure at rank 1, epoch 2"):
        warm.train({}, 3, None, str(tmp_path / "crash.pt"), fault=Fault(rank=1, epoch=2, how="raise"))
    assert not (tmp_path / "crash.pt").exists()
    assert processes_with(pool_dir) == [] and not Path(pool_dir).exists()  # torn down
    after = warm.train({}, 1, None, str(tmp_path / "after.pt"))  # relaunched
    again = warm.train({}, 1, None, str(tmp_path / "again.pt"))
    assert (after.info["warm_start"], again.info["warm_start"]) == (0, 1) and pool.starts == starts + 1
    assert max_difference(weights(again.checkpoint), weights(str(tmp_path / "before.pt"))) == 0


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_hanging_rank_is_killed_at_the_trial_timeout(warm, tmp_path):
    warm.train({}, 1, None, str(tmp_path / "warmup.pt"))  # the pool is up: the timeout covers the hang only
    pool_dir = str(warm.pools[0].dir)
    warm.trial_timeout = 4.0
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out after 4 s"):
            warm.train({}, 1, None, str(tmp_path / "hang.pt"), fault=Fault(rank=0, how="hang"))
        assert time.monotonic() - started < 4 + 10
        assert processes_with(pool_dir) == []
    finally:
        warm.trial_timeout = 600.0


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_concurrent_calls_get_a_pool_each_and_close_leaves_no_processes(tmp_path):
    trainer = SmallTorchTrainer(DIGITS, workers=2, threads_per_rank=1, max_train_rows=256, scratch_dir=str(tmp_path),
                           pools=warm_pools)
    with ThreadPoolExecutor(2) as threads:
        runs = list(threads.map(lambda i: trainer.train({}, 1, None, str(tmp_path / f"c{i}.pt")), range(2)))
    assert len(trainer.pools) == 2 and all(p.alive for p in trainer.pools)
    assert max_difference(weights(runs[0].checkpoint), weights(runs[1].checkpoint)) == 0
    dirs = [str(p.dir) for p in trainer.pools]
    trainer.close()
    trainer.close()  # idempotent
    assert not any(p.alive for p in trainer.pools)
    assert all(processes_with(d) == [] and not Path(d).exists() for d in dirs)
    assert not [cmd for cmd in torch_descendants(os.getpid()) for d in dirs if d in cmd]


def test_pool_options():
    with pytest.raises(InputError, match="pool_size must be >= 1"):
        TorchTrainer(DIGITS, pool_size=0)
    assert TorchTrainer(DIGITS, pools=warm_pools).warm
    assert not TorchTrainer(DIGITS, pools=warm_pools, warm=False).warm
    assert not TorchTrainer(DIGITS).warm  # built without the plug-in's pools: every call launches its ranks
    with pytest.raises(InputError, match="warm=True needs the warm pools"):
        TorchTrainer(DIGITS, warm=True)
    assert registry.get("torch").build(TrainerSettings("torch", DIGITS)).warm  # a job's trainer: warm
    single = TorchTrainer(DIGITS, workers=2, pool_size=1)
    command = single.serve_command(Path("/tmp/pool"))
    assert command[command.index("--serve") + 1] == "/tmp/pool" and "--owner" in command
    assert command[command.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"


@pytest.mark.slow  # real processes (DDP ranks, Dask workers): the fast tier keeps the loop's behaviours on fakes
def test_close_leaves_no_processes(warm, tmp_path):
    warm.train({}, 1, None, str(tmp_path / "last.pt"))
    assert any(p.alive for p in warm.pools)
    warm.close()
    assert torch_descendants(os.getpid()) == []
