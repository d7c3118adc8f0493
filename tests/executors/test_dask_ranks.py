"""TorchTrainer on a Dask cluster: a trial-rung's DDP ranks on a group of Dask workers on two "hosts"."""

from __future__ import annotations

import pytest
import torch
from dask_cluster import cluster  # tests/dask_cluster.py

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors.dask_ranks import torch_on
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG
from prefect_hyperband.trainers.torch.ddp import TorchTrainer

DIGITS = DataSpec("digits")
#: one worker on 127.0.0.1, two on 127.0.0.2, one on 127.0.0.3: groups of two, packed by host, span two hosts each
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"]


def weights(checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]


class _Rank:
    """A rank's future: done from its ``done_at``-th look on (never, for None)."""

    def __init__(self, done_at: int | None):
        self.done_at, self.looks = done_at, 0

    def done(self) -> bool:
        self.looks += 1
        return self.done_at is not None and self.looks >= self.done_at


def test_a_ranks_error_before_the_scheduler_sees_its_worker_gone_is_a_lost_group_not_a_failed_trial(monkeypatch):
    """A killed worker's peer fails first (gloo's "Connection reset by peer"), the scheduler learns of the death
    later: the look for a lost worker goes on until it does (the dead worker's rank never ends). Seen in CI: looked
    at after the cancel (a cancelled rank is done), the look ended at once and the trial failed instead of running
    again on another group."""
    from prefect_hyperband.executors import dask_ranks

    ranks = object.__new__(dask_ranks.DaskRanks)
    answers = iter([[], [], [], ["tcp://127.0.0.2:1"]])  # the scheduler's word on the group's workers, in turn
    monkeypatch.setattr(ranks, "_gone", lambda group: next(answers))
    monkeypatch.setattr(dask_ranks.time, "sleep", lambda seconds: None)
    group = ("tcp://127.0.0.1:1", "tcp://127.0.0.2:1")
    assert ranks._lost(group, [_Rank(1), _Rank(None)], grace=60) == ["tcp://127.0.0.2:1"]


def test_a_trials_own_error_in_every_rank_fails_it_as_soon_as_the_last_rank_raises(monkeypatch):
    """The user's code raises in each rank, a few milliseconds apart: the look ends when the last rank has ended by
    itself, not after the grace (it waited the whole 10 s when it went by which ranks had ended at the first
    error); one rank's error with its peers held in a collective waits the grace, then fails the trial."""
    from prefect_hyperband.executors import dask_ranks

    ranks = object.__new__(dask_ranks.DaskRanks)
    looks = []
    monkeypatch.setattr(ranks, "_gone", lambda group: looks.append(1) or [])
    clock = iter(range(1000))
    monkeypatch.setattr(dask_ranks.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(dask_ranks.time, "sleep", lambda seconds: None)
    group = ("tcp://127.0.0.1:1", "tcp://127.0.0.2:1")
    assert ranks._lost(group, [_Rank(1), _Rank(3)], grace=60) == []
    assert len(looks) == 3  # the second rank raised on the third look
    looks.clear()
    assert ranks._lost(group, [_Rank(1), _Rank(None)], grace=60) == []
    assert 55 <= len(looks) <= 65  # the grace, on the fake clock


@pytest.mark.slow  # real scheduler and worker processes, one killed
def test_a_worker_killed_mid_trial_rung_runs_it_again_on_another_group_and_its_place_is_taken(tmp_path):
    import os
    import signal
    import threading
    import time

    with cluster(HOSTS, str(tmp_path)) as c:
        trainer = TorchTrainer(DIGITS, workers=2, threads_per_rank=1, placement=torch_on(c.address))
        try:
            group = trainer.worker_groups.groups[0]  # the first trial-rung takes the first group
            pid = trainer._dask.ranks.client.run(os.getpid, workers=[group[1]])[group[1]]
            threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()  # its rank 1, mid-training
            retried = trainer.train(DEFAULT_CONFIG, 20, None, str(tmp_path / "retried.pt"))
            assert retried.info["attempts"] == 2 and retried.info["lost_worker_seconds"] > 0
            assert group not in trainer.worker_groups.groups and group in trainer.worker_groups.retired
            from prefect_hyperband.executors.dask_groups import executing, workers_of

            client = trainer._dask.ranks.client
            deadline = time.monotonic() + 180  # Dask's nanny restarts the worker, under a new address
            while time.monotonic() < deadline:  # the killed one gone, four again, and the survivor's rank ended
                workers = workers_of(client)  # (at its collective's error: seconds when loaded)
                if group[1] not in workers and len(workers) >= 4 and \
                        not client.run(executing, workers=[group[0]]).get(group[0], 1):
                    break
                time.sleep(0.5)
            whole = trainer.train(DEFAULT_CONFIG, 20, None, str(tmp_path / "whole.pt"))
            assert len(trainer.worker_groups.groups) == 2 and group[0] in {a for g in trainer.worker_groups.groups for a in g}
        finally:
            trainer.close()
    for name, tensor in weights(whole.checkpoint).items():  # the retried trial-rung trained the same numbers
        assert torch.allclose(weights(retried.checkpoint)[name], tensor, atol=1e-6), name
    assert [h["val_accuracy"] for h in retried.history] == pytest.approx([h["val_accuracy"] for h in whole.history], abs=1e-6)


@pytest.mark.slow  # a real scheduler, killed
def test_warm_workers_then_a_lost_scheduler_stops_the_job_naming_it(tmp_path):
    import signal
    import threading

    from prefect_hyperband.trainers import stopping

    with cluster(HOSTS[:2], str(tmp_path)) as c:
        trainer = TorchTrainer(DIGITS, workers=2, threads_per_rank=1, placement=torch_on(c.address))
        token = stopping.StopToken()
        try:
            with pytest.raises(InputError, match="has 2 workers, fewer than --workers 3"):
                TorchTrainer(DIGITS, workers=3, placement=torch_on(c.address))
            # one worker as a failed rendezvous leaves it (torch's group counter raised, its peer's not): its next
            # group must still meet, not wait out the collective timeout on keys named differently
            def as_after_a_failed_init() -> None:  # defined here: Dask ships it by value to a worker
                import torch.distributed as dist

                dist.distributed_c10d._world.group_count = 1

            one = trainer.worker_groups.groups[0][0]
            trainer._dask.ranks.client.run(as_after_a_failed_init, workers=[one])
            first = trainer.train(DEFAULT_CONFIG, 1, None, str(tmp_path / "first.pt"))
            again = trainer.train(DEFAULT_CONFIG, 1, None, str(tmp_path / "again.pt"))
            assert (first.info["warm_start"], again.info["warm_start"]) == (0.0, 1.0)  # the workers' second rank: warm
            # the second trial-rung found its process group joined: one rendezvous per group, not per trial-rung
            def joined_world() -> tuple:  # on a worker: its ranks' rendezvous, and how many groups it has made
                import torch.distributed as dist

                from prefect_hyperband.executors import dask_ranks

                return dask_ranks._JOINED["key"], dist.distributed_c10d._world.group_count

            joined = trainer._dask.ranks.client.run(joined_world)
            assert len(joined) == 2 and all(key is not None and groups == 1 for key, groups in joined.values())
            assert len({key[:2] for key, _ in joined.values()}) == 1  # both ranks of one rendezvous
            threading.Timer(3.0, c.scheduler.send_signal, (signal.SIGKILL,)).start()  # mid-trial-rung
            with stopping.bind(token), pytest.raises(stopping.Stopped, match="Dask scheduler at .* is unreachable"):
                trainer.train(DEFAULT_CONFIG, 30, None, str(tmp_path / "cut.pt"))
            assert token.requested() and token.reason == f"the Dask scheduler at {c.address} is unreachable"
        finally:
            trainer.close()
