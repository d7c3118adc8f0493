"""The user's training function on a Dask cluster (``--trainer file.py:train --dask-address ...``): one trial-rung
per Dask worker, the workers the cluster already runs, warm (the function's module stays imported in the worker, and
what it caches, its data say, stays cached).

Each trial-rung takes a free worker (``dask_ranks.DaskRanks`` over groups of one: its retries on a lost worker, its
stop), and the function runs there in a task pinned to that worker. Nothing needs a shared folder: a function of a
file travels as the file's bytes (a worker with the same file at the same path loads it in place, so its sibling
modules import), one of a module as a reference (the module must be installed on the workers, as Prefect workers
need it too), one without an importable name (a notebook's, a closure) by value; the trial's checkpoint directory
travels as a tar to the worker and back. ``trial.report`` gives the trial-rung back when the job stops or gives it
up (the trial-rung's cancel event, looked at once a second), as it does in the job's own threads.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect_hyperband.executors.dask_ranks import DaskRanks, OnDask
from prefect_hyperband.executors.dask_script import CANCEL_POLL, code_here, pack, shipped, unpack
from prefect_hyperband.trainers import function, stopping


def function_rank(job: Mapping[str, Any], env: Mapping[str, str], data: Any, previous: bytes | None,
                  timeout: float) -> dict[str, Any]:
    """One trial-rung of the function, in a Dask worker: its metrics, reports, seconds and checkpoint files."""
    with tempfile.TemporaryDirectory(prefix="hyperband-function-") as tmp:
        fn = job.get("fn") or function.load(f"{code_here(job, Path(tmp))}:{job['name']}")
        restored = Path(tmp, "previous") if previous is not None else None
        if restored is not None:
            unpack(previous, restored)
        out = Path(tmp, "checkpoint")
        out.mkdir()
        trial = function.Trial(dict(job["config"]), job["resource"], job["start"],
                               str(restored) if restored else None, str(out), trial_id=job["trial_id"])
        token, done = stopping.StopToken(), threading.Event()
        watcher = threading.Thread(target=_watch, args=(job["cancel"], token, done), daemon=True)
        watcher.start()
        try:
            with stopping.bind(token):
                returned, seconds = function.call(fn, trial)
        finally:
            done.set()
        return {"metrics": function.metrics_of(returned, job["metric"]), "history": trial.history,
                "seconds": seconds, "checkpoint": pack(out)}


def _watch(name: str, token: stopping.StopToken, done: threading.Event) -> None:
    """Request the trial-rung's stop when its cancel event is set (the job stopped, the trial-rung given up)."""
    from distributed import Event

    event = Event(name)
    while not done.wait(CANCEL_POLL):
        try:
            if event.is_set():
                token.request(reason="the trial-rung was given up")
                return
        except Exception:  # the scheduler gone: the job stops its side; this training ends on its own
            return


def run_function(ranks: Any, trainer: Any, trial: Any, checkpoint_dir: Path | None, directory: Path) -> Any:
    """A function trial-rung on a free worker of the cluster; its checkpoint files land in ``directory``. Returns
    ``(metrics, history, seconds, Ran)``."""
    entry: str = trainer.entry
    target, _, name = entry.rpartition(":")
    code = {**shipped(target), "name": name} if target.endswith(".py") else {"fn": trainer.fn}
    job = {**code, "config": trial.config, "resource": trial.resource, "start": trial.start,
           "trial_id": trial.trial_id, "metric": trainer.metric}
    previous = pack(checkpoint_dir) if checkpoint_dir is not None else None
    ran = ranks.run(function_rank, job, previous, float("inf"))
    result = ran.results[0]
    unpack(result["checkpoint"], directory)
    return result["metrics"], result["history"], result["seconds"], ran


def function_on(address: str) -> Callable[[Any], Any]:
    """The user function's placement on the cluster at ``address``: a trial-rung on any free worker (groups of one,
    no rendezvous)."""
    return lambda trainer: OnDask(DaskRanks(address, 1, rendezvous=False), run_function)
