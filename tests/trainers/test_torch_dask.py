"""TorchTrainer on a Dask cluster: a trial-rung's DDP ranks on a group of Dask workers on two "hosts"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dask_cluster import cluster  # tests/dask_cluster.py
from prefect_hyperband.trainers import dask_groups
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.errors import InputError
from prefect_hyperband.trainers.torch_ddp import DEFAULT_CONFIG, TorchTrainer

DIGITS = DataSpec("digits")
#: one worker on 127.0.0.1, two on 127.0.0.2, one on 127.0.0.3: groups of two, packed by host, span two hosts each
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"]


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]


@pytest.mark.slow  # real scheduler and worker processes
def test_ranks_on_dask_workers_of_two_hosts_train_the_local_numbers(tmp_path):
    with cluster(HOSTS, str(tmp_path)) as c:
        with pytest.raises(InputError, match="has 4 workers, fewer than --workers 5"):
            TorchTrainer(DIGITS, workers=5, dask_address=c.address)
        remote = TorchTrainer(DIGITS, workers=2, threads_per_rank=1, max_train_rows=512, dask_address=c.address)
        try:
            assert [len({dask_groups.host_of(a) for a in g}) for g in remote._dask.groups] == [2, 2]  # across hosts
            first = remote.train(DEFAULT_CONFIG, 2, None, str(tmp_path / "r2.pt"))
            resumed = remote.train(DEFAULT_CONFIG, 5, first.checkpoint, str(tmp_path / "r5.pt"))
            again = remote.train(DEFAULT_CONFIG, 2, None, str(tmp_path / "again.pt"))
        finally:
            remote.close()
    local = TorchTrainer(DIGITS, workers=2, threads_per_rank=1, max_train_rows=512, warm=False)
    whole = local.train(DEFAULT_CONFIG, 5, None, str(tmp_path / "local5.pt"))
    # resumed from the checkpoint the cluster sent back (every rank's RNG state in it): training to 5 at once, here
    for name, tensor in weights(whole.checkpoint).items():
        assert torch.allclose(weights(resumed.checkpoint)[name], tensor, atol=1e-6), name
    assert [h["step"] for h in resumed.history] == [3, 4, 5] and resumed.resource_trained == 3
    assert resumed.history[-1]["val_accuracy"] == pytest.approx(whole.history[-1]["val_accuracy"], abs=1e-6)
    assert np.isclose(remote.evaluate(resumed.checkpoint), local.evaluate(whole.checkpoint), atol=1e-6)
    assert first.info["world_size"] == 2 and first.workers == 2
    assert (first.info["warm_start"], again.info["warm_start"]) == (0.0, 1.0)  # the second use of the workers: warm


@pytest.mark.slow  # real scheduler and worker processes, one killed
def test_a_worker_killed_mid_trial_rung_runs_it_again_on_another_group_and_its_place_is_taken(tmp_path):
    import os
    import signal
    import threading
    import time

    with cluster(HOSTS, str(tmp_path)) as c:
        trainer = TorchTrainer(DIGITS, workers=2, threads_per_rank=1, dask_address=c.address)
        try:
            group = trainer._dask.groups[0]  # the first trial-rung takes the first group
            pid = trainer._dask.client.run(os.getpid, workers=[group[1]])[group[1]]
            threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()  # its rank 1, mid-training
            retried = trainer.train(DEFAULT_CONFIG, 20, None, str(tmp_path / "retried.pt"))
            assert retried.info["attempts"] == 2 and retried.info["lost_worker_seconds"] > 0
            assert group not in trainer._dask.groups and group in trainer._dask._groups.retired
            deadline = time.monotonic() + 60  # Dask's nanny restarts the worker, under a new address
            while len(trainer._dask.client.scheduler_info()["workers"]) < 4 and time.monotonic() < deadline:
                time.sleep(0.5)
            whole = trainer.train(DEFAULT_CONFIG, 20, None, str(tmp_path / "whole.pt"))
            assert len(trainer._dask.groups) == 2 and group[0] in {a for g in trainer._dask.groups for a in g}
        finally:
            trainer.close()
    for name, tensor in weights(whole.checkpoint).items():  # the retried trial-rung trained the same numbers
        assert torch.allclose(weights(retried.checkpoint)[name], tensor, atol=1e-6), name
    assert [h["val_accuracy"] for h in retried.history] == pytest.approx([h["val_accuracy"] for h in whole.history], abs=1e-6)
