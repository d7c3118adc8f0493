"""PyTorch DDP trial-rungs on a Dask cluster: the ranks of one trial-rung on a disjoint group of Dask workers.

A trial-rung takes a free group of ``workers`` Dask workers (``dask_groups``, the XGBoost trainer's rule, W // N
groups on W workers) and runs one rank per worker as a Dask task pinned there (``workers=[address],
allow_other_workers=False``). The ranks meet at a rendezvous on the group's first worker: its host as Dask
reports it and a port free there, with torchrun's contract (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); gloo on CPU, NCCL where the worker has a GPU.

Warm: the Dask workers stay up between trial-rungs with torch imported, and each group holds the training split in
its workers' memory (scattered once, as Dask worker data), so a trial-rung pays a rendezvous, not a process start.
Checkpoints travel through Dask: the previous checkpoint's bytes go to every rank (each restores its own RNG
state from it), rank 0's new checkpoint comes back, so the job and the workers share no folder. Every rank runs
``trainers.torch.worker.train_job``, the code of the local ranks: the same numbers wherever a trial trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect_hyperband.common.ports import free_port
from prefect_hyperband.executors import dask_groups
from prefect_hyperband.executors.dask_groups import GroupLost
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.launch import contract

#: seconds between looks at a stop request and the deadline while the ranks train
WAIT_POLL = 0.5
#: seconds a collective may wait for a peer: a lost worker releases its group's other ranks at this timeout at worst
COLLECTIVE_TIMEOUT = 120.0
#: times a trial-rung runs again on another group after its group lost a worker (then the trial fails)
RETRIES = 2
#: seconds to look for a lost worker after a rank's error (the scheduler may learn of it after the peers)
LOST_GRACE = 10.0


def rank_task(job: Mapping[str, Any], env: Mapping[str, str], data: Mapping[str, Any], checkpoint: bytes | None,
              timeout: float = COLLECTIVE_TIMEOUT) -> dict[str, Any] | None:
    """One rank of one trial-rung, in a Dask worker: join the group at ``MASTER_ADDR:MASTER_PORT``, train, leave.
    Rank 0 returns the new checkpoint's bytes and the result (history, timings); the others None."""
    import torch.distributed as dist

    from prefect_hyperband.trainers.torch import worker as torch_worker

    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    with tempfile.TemporaryDirectory(prefix="hyperband-rank-") as tmp:
        job = {**job, "workdir": tmp, "out": os.path.join(tmp, "out.pt"), "result": os.path.join(tmp, "result.json")}
        if checkpoint is not None:
            Path(tmp, "in.pt").write_bytes(checkpoint)
            job["checkpoint"] = os.path.join(tmp, "in.pt")
        # a Dask worker given its own GPUs (CUDA_VISIBLE_DEVICES, as dask-cuda starts them) runs its rank on its first
        device, backend = torch_worker.device_for(0 if os.environ.get("CUDA_VISIBLE_DEVICES") else int(env["LOCAL_RANK"]))
        _join(dist, env, backend, timeout)
        try:
            torch_worker.train_job(job, rank, world, device, backend, torch_worker.Arrays(data, rank, world))
        except BaseException:  # the group's collectives may be out of step: the next trial-rung meets afresh
            _leave(dist)
            raise
        if rank != 0:
            return None
        return {"checkpoint": Path(job["out"]).read_bytes(), "result": json.loads(Path(job["result"]).read_text())}


#: the process group this worker's ranks belong to, kept between trial-rungs of the same group: (master, port,
#: rank, world) of its rendezvous; a trial-rung of the same group (same rendezvous) skips the rendezvous
_JOINED: dict[str, Any] = {"key": None}


def _join(dist: Any, env: Mapping[str, str], backend: str, timeout: float) -> None:
    """This rank in its group's process group: the one it already joined when the group (its rendezvous: the
    driver keeps a group's port while its ranks succeed) is the same, else a fresh rendezvous."""
    key = (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"])
    if dist.is_initialized() and _JOINED["key"] == key:
        return
    _leave(dist)
    _fresh_world(dist)
    dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                            timeout=timedelta(seconds=timeout))
    _JOINED["key"] = key


def _leave(dist: Any) -> None:
    _JOINED["key"] = None
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _fresh_world(dist: Any) -> None:
    """Name this rank's process group as a fresh process would. torch names a default group by a per-process
    counter (its store keys carry the name) and resets it only in ``destroy_process_group``; a rank whose
    ``init_process_group`` failed (its peer's worker killed mid-rendezvous) leaves it raised, and its worker's next
    group would then wait on keys its peers never write, until the collective timeout."""
    if dist.is_initialized():
        dist.destroy_process_group()  # resets the counter
    else:
        dist.distributed_c10d._world.group_count = 0  # what destroy_process_group does (no public call for it)


@dataclass
class Ran:
    """One trial-rung's ranks on a group: each rank's return value (rank order), and what getting there cost."""

    results: list[Any]
    group: tuple[str, ...]
    warm: float  # 1.0 when every worker of the group had run a rank of this job before
    lost_worker_seconds: float  # attempts on groups that lost a worker: wall seconds x ranks
    attempts: int


class DaskRanks:
    """The job's side: a client of the cluster at ``address``, its groups of ``workers``, each holding ``data``.

    ``run(task, ...)`` runs ``task(job, env, data, previous, timeout)`` as one rank per worker of a free group. A
    group that loses a worker mid-trial-rung is retired (its other ranks are released by their collective's error
    or timeout) and the trial-rung runs again, from the same checkpoint, on another group: ``retries`` times,
    then it fails with the reasons. Any other error of a rank fails the trial-rung at once."""

    def __init__(self, address: str, workers: int, data: Mapping[str, Any] | None = None,
                 timeout: float = COLLECTIVE_TIMEOUT, retries: int = RETRIES, rendezvous: bool = True,
                 keep_world: bool = False) -> None:
        self.client = dask_groups.connect(address, workers)
        self.address, self.timeout, self.retries, self.rendezvous = address, timeout, retries, rendezvous
        #: the ranks keep their process group between trial-rungs (``rank_task``): a group's rendezvous port is
        #: kept while its trial-rungs succeed, so the next one finds its process group joined (a script's ranks are
        #: processes that end: each trial-rung meets at a new port)
        self.keep_world = keep_world
        self._ports: dict[tuple[str, ...], int] = {}
        keep = (lambda group: None) if data is None else (
            lambda group: self.client.scatter([dict(data)], workers=list(group), broadcast=True, hash=False)[0])
        self._groups = dask_groups.WorkerGroups(self.client, workers, keep)
        self._used: set[str] = set()  # workers that have run a rank (torch imported, the code loaded)

    @property
    def worker_groups(self) -> dask_groups.WorkerGroups:
        return self._groups

    @property
    def groups(self) -> list[tuple[str, ...]]:
        """The live groups (a group that lost a worker is retired, and its other workers regroup)."""
        return self._groups.groups

    def run(self, task: Callable[..., Any], job: Mapping[str, Any], previous: Any, deadline: float) -> Ran:
        """Run ``task`` on a free group within ``deadline`` seconds; again on another group when one loses a worker."""
        try:
            return self._run(task, job, previous, deadline)
        except Exception:
            dask_groups.stop_if_unreachable(self.client, self.address)
            raise

    def _run(self, task: Callable[..., Any], job: Mapping[str, Any], previous: Any, deadline: float) -> Ran:
        ends = time.monotonic() + deadline
        lost, reasons = 0.0, []
        while True:
            with self._groups.take() as (group, data):
                alive = dask_groups.workers_of(self.client)  # one look: the check and the hosts agree
                if self._gone(group, alive):  # lost while free: no work lost, no attempt spent
                    self._groups.retire(group)
                    continue
                hosts = [alive[a]["host"] for a in group]
                began = time.monotonic()
                try:
                    results = self._attempt(task, job, previous, group, hosts, data, ends)
                except GroupLost as exc:
                    lost += (time.monotonic() - began) * len(group)
                    reasons.append(str(exc))
                    self._groups.retire(group)
                    if len(reasons) > self.retries:
                        raise RuntimeError(f"the trial-rung lost its Dask group {len(reasons)} times: "
                                           + "; ".join(reasons)) from exc
                    continue
            warm = float(all(a in self._used for a in group))
            self._used.update(group)
            return Ran(results, group, warm, lost, len(reasons) + 1)

    def _attempt(self, task: Callable[..., Any], job: Mapping[str, Any], previous: Any, group: tuple[str, ...],
                 hosts: list[str], data: Any, ends: float) -> list[Any]:
        try:  # a port on the first worker for the ranks to meet at (a task of one, a user's function, meets nobody)
            port = self._ports.get(group) or (
                self.client.run(free_port, workers=[group[0]])[group[0]] if self.rendezvous else 0)
        except Exception as exc:
            gone = self._gone(group)
            if gone:
                raise GroupLost(group, gone, exc) from exc
            raise
        job = {**job, "launched_at": time.time(), "cancel": f"hyperband-cancel-{uuid.uuid4().hex}"}
        gpus = self._groups.gpus(group)  # workers started with --resources GPU=1: a rank holds its GPU
        futures = [
            self.client.submit(
                task, job, contract(i, len(group), hosts[:i].count(host), hosts.count(host), hosts[0], port),
                data, previous, self.timeout, workers=[address], allow_other_workers=False, pure=False,
                **({"resources": gpus} if gpus else {}),
            )
            for i, (address, host) in enumerate(zip(group, hosts))
        ]
        try:
            self._wait(futures, ends, group)
        except BaseException as exc:
            gone: list[str] = []
            try:
                if isinstance(exc, Exception) and not isinstance(exc, GroupLost):
                    erred = any(f.status in ("error", "lost") for f in futures)  # not a stop, a deadline, the scheduler
                    gone = self._lost(group, futures) if erred else self._gone(group)  # before the cancel (below)
            finally:
                self._ports.pop(group, None)  # the ranks left their process group (or are stuck in it): meet afresh
                self._give_up(job["cancel"], futures)
            if gone:
                raise GroupLost(group, gone, exc) from exc
            raise
        if self.keep_world:
            self._ports[group] = port
        return [f.result() for f in futures]

    def _give_up(self, cancel: str, futures: list) -> None:
        """Cancel the ranks: a rank that runs a process (a script) ends it at the trial-rung's cancel event; a rank
        in a collective is released by its peers' errors or the collective's timeout."""
        from distributed import Event

        with contextlib.suppress(Exception):  # the scheduler gone: the ranks end at their own timeout
            Event(cancel, client=self.client).set()
        for f in futures:
            f.cancel()

    def _gone(self, group: tuple[str, ...], alive: Mapping[str, Any] | None = None) -> list[str]:
        """The group's workers not among ``alive`` (the scheduler's workers, asked now if not given)."""
        alive = dask_groups.workers_of(self.client) if alive is None else alive
        return [a for a in group if a not in alive]

    def _lost(self, group: tuple[str, ...], ranks: list, grace: float = LOST_GRACE) -> list[str]:
        """The group's workers that left, given a rank's error, asked before the ranks are cancelled: a peer's error
        (gloo's "Connection reset by peer") often comes before the scheduler sees the worker go, so look until the
        scheduler says so, or every rank has ended by itself (a trial's own error, raised by each rank: a dead
        worker's rank never ends), or ``grace`` seconds (one rank's error, its peers held in a collective). Looked
        at after the cancel, a cancelled rank is done: the look ended at once and a killed worker's trial failed
        (CI, 374f946); with a snapshot of the ranks at the first error, a trial's own error waited the whole grace."""
        ends = time.monotonic() + grace
        while True:
            gone = self._gone(group)
            if gone or all(f.done() for f in ranks) or time.monotonic() > ends:
                return gone
            time.sleep(0.1)

    def _wait(self, futures: list, deadline: float, group: tuple[str, ...]) -> None:
        """Until every rank is done; the first rank's error raised at once (its peers are then cancelled, and a
        collective they wait in ends at its timeout); a worker of the group gone (``GroupLost``: its rank never
        ends, and a peer blocked in the rendezvous may not fail before the collective timeout), a stop of the job,
        the deadline or the scheduler's connection lost ends the wait too."""
        from distributed import wait

        pending = list(futures)
        while pending:
            if self.client.status != "running":
                raise ConnectionError("lost the connection to the Dask scheduler")
            gone = self._gone(group)
            if gone:
                raise GroupLost(group, gone, None)
            with contextlib.suppress(TimeoutError):  # Dask's wait raises when none is done in time
                wait(pending, timeout=WAIT_POLL, return_when="FIRST_COMPLETED")
            for f in [f for f in pending if f.done()]:
                if f.status != "finished":
                    f.result()  # raises the rank's error (or CancelledError)
                pending.remove(f)
            stopping.check()
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"timed out on Dask workers {', '.join(group)}")

    def close(self) -> None:
        self._groups.close()
        self.client.close()


def run_torch(ranks: DaskRanks, job: Mapping[str, Any], checkpoint: str | None, out: str, deadline: float) -> dict[str, Any]:
    """A torch trial-rung on the cluster: every rank gets the previous checkpoint's bytes (each restores its own RNG
    state from it), rank 0's new checkpoint is written to ``out``; the result (history, timings, the group)."""
    previous = Path(checkpoint).read_bytes() if checkpoint else None
    ran = ranks.run(rank_task, job, previous, deadline)
    first = ran.results[0]
    tmp = f"{out}.tmp-{os.getpid()}"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(tmp).write_bytes(first["checkpoint"])
    os.replace(tmp, out)
    return {**first["result"], "group": list(ran.group), "warm_start": ran.warm,
            "lost_worker_seconds": ran.lost_worker_seconds, "attempts": ran.attempts}


class OnDask:
    """A trainer's trial-rungs on a Dask cluster (``--dask-address``), the placement a model's plug-in gives its
    trainer (``trainers.base.Placement``): ``ranks`` places them, ``run(ranks, trainer, *args)`` is what one
    trial-rung of that kind of trainer is there (``run_torch`` below, ``dask_function.run_function``,
    ``dask_script.run_script``)."""

    def __init__(self, ranks: DaskRanks, run: Callable[..., Any]) -> None:
        self.ranks, self._run = ranks, run

    @property
    def worker_groups(self) -> dask_groups.WorkerGroups:
        return self.ranks.worker_groups

    def train(self, trainer: Any, *args: Any) -> Any:
        return self._run(self.ranks, trainer, *args)

    def close(self) -> None:
        self.ranks.close()


def torch_on(address: str) -> Callable[[Any], OnDask]:
    """The torch trainer's placement on the cluster at ``address``: each group of ``trainer.workers`` workers holds
    the training split (scattered once) and keeps its process group between trial-rungs."""
    return lambda trainer: OnDask(DaskRanks(address, trainer.workers, trainer.arrays(), keep_world=True),
                                  lambda ranks, _trainer, *args: run_torch(ranks, *args))
