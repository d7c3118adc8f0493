"""Job state on disk: JSON files in the job directory, written atomically, read back by ``--resume``."""

from __future__ import annotations

import json
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler, PriorFirst, Sampler, Scheduler
from prefect_hyperband.hyperband.space import Space, parse
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.tasks.storage import PREVIOUS, Storage, is_local, join
from prefect_hyperband.trainers.errors import InputError

T = TypeVar("T")


def lock_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / "lock"


def _holder(job_dir: str | Path) -> dict[str, Any] | None:
    """Who holds the job's lock, if a live process does (a dead one's lock on this host is stale)."""
    try:
        holder = json.loads(lock_path(job_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"host": "?", "pid": "?"}  # being written this instant: held
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return None
        except (PermissionError, ValueError, KeyError):
            pass
    return holder


def check_free(job_dir: str | Path, job_id: str) -> None:
    """``InputError`` naming the holder when another process runs this job."""
    holder = _holder(job_dir)
    if holder is not None:
        raise InputError(f"job {job_id!r} is already running (host {holder.get('host')}, pid {holder.get('pid')}); "
                         "wait for it to end, or stop it, before running it again")


@contextmanager
def job_lock(job_dir: str | Path, job_id: str) -> Iterator[None]:
    """One process per job: held while the job runs; a stale lock of a dead process on this host is taken over."""
    path = lock_path(job_dir)
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_free(job_dir, job_id)
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def job_store(job_dir: str | Path, job_id: str, storage: str | None = None) -> Storage:
    """The job's record, state and checkpoints: in ``job_dir``, or under ``<storage>/<job_id>`` when that is a URL."""
    remote = join(storage, job_id) if storage and not is_local(storage) else None
    return Storage(remote or str(job_dir), str(job_dir))


def save_job_record(job: Job, params: dict[str, Any]) -> None:
    """``job.json``, and the same record as its previous version: a resume reads either."""
    record = {"job_id": job.job_id, "params": params, "parent_run_id": job.parent_run_id}
    store = job.store()
    store.write_json("job.json" + PREVIOUS, record)
    store.write_json("job.json", record)


def _job_record(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("params"), dict) or not value.get("job_id"):
        raise ValueError("not a job record (job_id and params expected)")
    return value


def load_job_record(store: Storage) -> dict[str, Any] | None:
    """The job's record, from its previous version when ``job.json`` is damaged (said in one line); None when the
    job has none; ``InputError`` naming the file when neither is good."""
    record, notice = store.read_kept("job.json", _job_record)
    if notice:
        _say(notice)
    return record


def save_state(job: Job, scheduler: Scheduler, rows: list[dict[str, Any]], elapsed: float, lost: float = 0.0,
               runs: dict[str, str] | None = None) -> None:
    """The scheduler (with its sampler), every finished trial-rung, the seconds spent so far, the
    worker-seconds of trainings that left no result (``lost``) and the trials' MLflow runs (``runs``); atomic,
    the state it replaces kept as the previous version (a resume falls back on it when this one is damaged)."""
    state = {"scheduler": scheduler.to_json(), "rows": rows, "elapsed": elapsed, "lost": lost, "runs": runs or {}}
    job.store().write_json("state.json", state, indent=None, keep_previous=True)


def load_state(job: Job, build: Callable[[dict[str, Any]], T]) -> tuple[dict[str, Any], T] | None:
    """The saved state and ``build`` of it (the scheduler), from the previous version when ``state.json`` is
    damaged or ``build`` rejects it (said in one line: the results since then are trained again); None for a
    new job; ``InputError`` naming the file when neither is good."""
    def check(saved: Any) -> tuple[dict[str, Any], T]:
        rows, elapsed, lost = saved["rows"], float(saved["elapsed"]), float(saved.get("lost", 0.0))
        if not isinstance(rows, list) or elapsed < 0 or lost < 0 or not isinstance(saved.get("runs", {}), dict):
            raise ValueError("rows, elapsed, lost or runs out of shape")
        return saved, build(saved["scheduler"])

    found, notice = job.store().read_kept("state.json", check)
    if notice:
        _say(notice)
    return found


def _say(text: str) -> None:
    """One line: in the flow run's log (the terminal and the UI) inside a run, on stderr before one starts."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        get_run_logger().warning(text)
    except MissingContextError:
        print(f"hyperband: {text}", file=sys.stderr, flush=True)


def make_sampler(job: Job, saved: dict[str, Any] | None = None) -> Sampler:
    space = parse(job.space)
    if job.sampler == "tpe":
        return TPESampler.from_json(space, saved) if saved else TPESampler(space, job.seed, job.directions)
    if job.sampler == "priorband":
        return PriorBandSampler.from_json(space, saved) if saved else PriorBandSampler(
            space, job.seed, job.directions, job.min_resource, job.max_resource, job.eta)
    return RandomSampler.from_json(space, saved) if saved else RandomSampler(space, job.seed)


def make_scheduler(job: Job, max_trials: int, time_budget: float | None, clock: Callable[[], float],
                   saved: dict[str, Any] | None = None) -> Scheduler:
    """The job's scheduler, new or as saved: ASHA, or Hyperband's brackets (in turn when TPE or PriorBand proposes
    configs: each bracket samples from what the earlier ones taught); with ``prior_first``, after the priors' mode
    trained straight to R."""
    space = parse(job.space)
    inner = _schedule(job, space, max_trials, time_budget, clock, saved)
    if not job.prior_first:
        return inner
    if saved:
        return PriorFirst.from_json(saved, inner)
    return PriorFirst(inner, priors.mode(space), job.max_resource)


def _schedule(job: Job, space: Space, max_trials: int, time_budget: float | None, clock: Callable[[], float],
              saved: dict[str, Any] | None) -> Scheduler:
    if job.mode == "asha":
        if saved:
            return AshaScheduler(AshaState.from_json(saved["state"]), make_sampler(job, saved["sampler"]),
                                 saved["max_trials"], saved["time_budget"], clock)
        state = AshaState.create(job.min_resource, job.max_resource, job.eta, job.directions)
        return AshaScheduler(state, make_sampler(job), max_trials, time_budget, clock)
    tpe = job.sampler in ("tpe", "priorband")
    if saved:
        sampler = make_sampler(job, saved["sampler"]) if saved.get("sampler") else None
        return HyperbandScheduler.from_json(saved, space, sampler)
    return HyperbandScheduler(job.min_resource, job.max_resource, job.eta, job.directions, space, job.seed,
                              make_sampler(job) if tpe else None, sequential=tpe)
