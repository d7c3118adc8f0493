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
``torch_worker.train_job``, the code of the local ranks: the same numbers wherever a trial trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from prefect_hyperband.trainers import dask_groups, stopping

#: seconds between looks at a stop request and the deadline while the ranks train
WAIT_POLL = 0.5
#: seconds a collective may wait for a peer: a lost worker releases its group's other ranks at this timeout at worst
COLLECTIVE_TIMEOUT = 120.0


def free_port() -> int:
    """A port free on this host (run on the group's first worker, for its rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def contract(rank: int, world: int, local_rank: int, local_world: int, master: str, port: int) -> dict[str, str]:
    """torchrun's environment contract for one rank."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": master, "MASTER_PORT": str(port)}


def rank_task(job: Mapping[str, Any], env: Mapping[str, str], data: Mapping[str, Any], checkpoint: bytes | None,
              timeout: float = COLLECTIVE_TIMEOUT) -> dict[str, Any] | None:
    """One rank of one trial-rung, in a Dask worker: join the group at ``MASTER_ADDR:MASTER_PORT``, train, leave.
    Rank 0 returns the new checkpoint's bytes and the result (history, timings); the others None."""
    import torch.distributed as dist

    from prefect_hyperband.trainers import torch_worker

    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    with tempfile.TemporaryDirectory(prefix="hyperband-rank-") as tmp:
        job = {**job, "workdir": tmp, "out": os.path.join(tmp, "out.pt"), "result": os.path.join(tmp, "result.json")}
        if checkpoint is not None:
            Path(tmp, "in.pt").write_bytes(checkpoint)
            job["checkpoint"] = os.path.join(tmp, "in.pt")
        device, backend = torch_worker.device_for(int(env["LOCAL_RANK"]))
        dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout))
        try:
            torch_worker.train_job(job, rank, world, device, backend, torch_worker.Arrays(data))
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return None
        return {"checkpoint": Path(job["out"]).read_bytes(), "result": json.loads(Path(job["result"]).read_text())}


class DaskRanks:
    """The trainer's side: a client of the cluster at ``address``, its groups of ``workers``, each holding ``data``."""

    def __init__(self, address: str, workers: int, data: Mapping[str, Any], timeout: float = COLLECTIVE_TIMEOUT) -> None:
        self.client = dask_groups.connect(address, workers)
        self.timeout = timeout
        self._groups = dask_groups.WorkerGroups(
            self.client, workers,
            lambda group: self.client.scatter([dict(data)], workers=list(group), broadcast=True, hash=False)[0])
        self.groups = self._groups.groups
        self._used: set[str] = set()  # workers that have run a rank (torch imported, the code loaded)

    def run(self, job: Mapping[str, Any], checkpoint: str | None, out: str, deadline: float) -> dict[str, Any]:
        """Train ``job`` on a free group; rank 0's checkpoint written to ``out``; the result (history, timings)."""
        with self._groups.take() as (group, data):
            alive = self.client.scheduler_info()["workers"]
            lost = [a for a in group if a not in alive]
            if lost:  # a pinned rank would wait for it forever: fail now, naming it
                raise RuntimeError(f"Dask worker(s) {', '.join(lost)} of this trial's group are gone (a restarted "
                                   "worker comes back under a new address); resume the job to regroup the cluster")
            hosts = [alive[a]["host"] for a in group]
            port = self.client.run(free_port, workers=[group[0]])[group[0]]
            previous = Path(checkpoint).read_bytes() if checkpoint else None
            job = {**job, "launched_at": time.time()}
            futures = [
                self.client.submit(
                    rank_task, job, contract(i, len(group), hosts[:i].count(host), hosts.count(host), hosts[0], port),
                    data, previous, self.timeout, workers=[address], allow_other_workers=False, pure=False,
                )
                for i, (address, host) in enumerate(zip(group, hosts))
            ]
            try:
                self._wait(futures, time.monotonic() + deadline, group)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
            result = futures[0].result()
        tmp = f"{out}.tmp-{os.getpid()}"
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(tmp).write_bytes(result["checkpoint"])
        os.replace(tmp, out)
        warm = float(all(a in self._used for a in group))
        self._used.update(group)
        return {**result["result"], "group": list(group), "warm_start": warm}

    @staticmethod
    def _wait(futures: list, deadline: float, group: tuple[str, ...]) -> None:
        """Until every rank is done; the first rank's error raised at once (its peers are then cancelled, and a
        collective they wait in ends at its timeout); a stop of the job or the deadline ends the wait too."""
        from distributed import wait

        pending = list(futures)
        while pending:
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
