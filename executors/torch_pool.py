"""Warm worker pools for ``TorchTrainer``: launch the ranks once per job, not once per trial-rung.

A ``TorchPool`` is one ``python -m torch.distributed.run ... -m trainers.torch.worker --serve DIR``
launch: its ``workers`` ranks import torch, join the gloo/NCCL process group and load the training
split once, then train one request after another (``trainers.torch.worker.serve``). The trainer
talks to it through files in DIR: it writes ``request-<n>.json`` (the same job dict a cold launch
gets), rank 0 broadcasts it, and writes ``result-<n>.json`` when the checkpoint is saved.

A pool runs one trial at a time. ``WarmPools`` hands each concurrent ``train`` call a pool of its
own (started on first use, each with its own rendezvous), up to ``pool_size`` pools.

Failures: a rank that raises or dies ends every rank, the launcher exits, and the call fails with
the rank's stderr tail; a call that outlives ``trial_timeout`` kills the pool's processes. Either
way the pool is torn down and relaunched by the next call that needs it. ``close()`` stops the
pools; rank 0 also stops by itself when the trainer's process is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.trainers.launch import failure_message, terminate
from prefect_hyperband.trainers.torch.requests import request_path

#: The trainer polls for the result file (and the launcher's exit) this often, in seconds: fast for
#: the first BACKOFF_AFTER seconds (short trials), then slower so a waiting thread does not spin.
WAIT_POLL_SECONDS = 0.002
SLOW_POLL_SECONDS = 0.01
BACKOFF_AFTER = 0.2
#: Seconds a pool gets to leave by itself after a stop request before it is killed.
STOP_GRACE = 5.0
#: An idle pool stops by itself after this many seconds (a trainer never closed leaks nothing for
#: long); the next call relaunches it.
IDLE_SECONDS = 600.0

_live: weakref.WeakSet[TorchPool] = weakref.WeakSet()


class TorchPool:
    """One warm set of ``workers`` ranks; ``run`` trains one job on it at a time.

    ``command(pool_dir)`` gives the launcher's command line, ``prepare(pool_dir)`` writes the data
    (and returns its description for ``pool.json``), ``environment()`` the launcher's environment.
    """

    def __init__(
        self,
        command: Callable[[Path], list[str]],
        prepare: Callable[[Path], dict[str, Any]],
        environment: Callable[[], dict[str, str]],
        threads_per_rank: int,
        scratch_dir: str | None = None,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._command, self._prepare, self._environment = command, prepare, environment
        self.threads_per_rank, self.idle_seconds = threads_per_rank, idle_seconds
        self.scratch_dir = scratch_dir
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.launched_at = 0.0  # time.time() of the launch
        self.jobs = 0  # jobs sent to this launch
        self.starts = 0  # launches so far
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the ranks (returns at once; the first request waits for them to be ready)."""
        self.stop()
        pool_dir = Path(tempfile.mkdtemp(prefix="torch-pool-", dir=self.scratch_dir)).resolve()
        data = self._prepare(pool_dir)
        write_json_atomic(pool_dir / "pool.json", {"data": data, "threads_per_rank": self.threads_per_rank, "idle_seconds": self.idle_seconds})
        self.dir, self.jobs = pool_dir, 0
        self.launched_at = time.time()
        with open(pool_dir / "launcher.log", "wb") as log:
            self.proc = subprocess.Popen(
                self._command(pool_dir), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self._environment(), start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        _live.add(self)

    def stop(self, graceful: bool = True) -> None:
        """Stop the ranks (a stop request, then SIGTERM/SIGKILL) and delete the pool's folder."""
        proc, pool_dir = self.proc, self.dir
        self.proc = self.dir = None
        if proc is not None and pool_dir is not None:
            if graceful and proc.poll() is None:
                write_json_atomic(request_path(pool_dir, self.jobs), {"op": "stop"})
                try:
                    proc.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    pass
            terminate(proc, str(pool_dir))
        if pool_dir is not None:
            shutil.rmtree(pool_dir, ignore_errors=True)
        _live.discard(self)

    # -- one job ----------------------------------------------------------------------------

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Train ``job`` on the pool (starting it if needed); its result dict, with ``warm_start``.

        Raises RuntimeError (rank stderr quoted) when a rank fails or the call times out; the
        pool is then stopped, and the next call relaunches it.
        """
        with self._lock:
            for attempt in range(2):
                warm = self.alive
                if not warm:
                    self.start()
                assert self.proc is not None and self.dir is not None
                proc, pool_dir = self.proc, self.dir
                outcome = self._send(job, timeout, warm, proc, pool_dir)
                if isinstance(outcome, dict):
                    return outcome
                if outcome == 0 and warm and attempt == 0:
                    self.stop(graceful=False)
                    continue  # it had just stopped by itself (idle): relaunch and send again
                break
            if outcome is None:  # timed out: kill first, then quote what the ranks left
                terminate(proc, str(pool_dir))
                message = failure_message(pool_dir, f"torch trial timed out after {timeout:g} s; killed")
            else:
                message = failure_message(pool_dir, f"torch trial failed: launcher exited with code {outcome}")
            self.stop(graceful=False)
            raise RuntimeError(message)

    def _send(
        self, job: dict[str, Any], timeout: float, warm: bool, proc: subprocess.Popen, pool_dir: Path
    ) -> dict[str, Any] | int | None:
        """Write the request and wait: the result, the launcher's exit code, or None on time-out."""
        seq = self.jobs
        self.jobs += 1
        result_path = pool_dir / f"result-{seq}.json"
        request = {
            **job,
            "workdir": str(pool_dir),
            "result": str(result_path),
            # the first job of a launch pays the launch: its startup is measured from it
            "launched_at": time.time() if warm else self.launched_at,
        }
        try:
            write_json_atomic(request_path(pool_dir, seq), request)
        except OSError:  # the pool was closed under us
            return proc.poll() if proc.poll() is not None else -1
        started = time.monotonic()
        deadline = started + timeout
        code: int | None = None
        while not result_path.is_file():
            code = proc.poll()
            now = time.monotonic()
            if code is not None or now > deadline:
                break
            time.sleep(WAIT_POLL_SECONDS if now - started < BACKOFF_AFTER else SLOW_POLL_SECONDS)
        if result_path.is_file():
            result = json.loads(result_path.read_text())
            result_path.unlink(missing_ok=True)
            result["warm_start"] = 1.0 if warm else 0.0
            return result
        return code


class WarmPools:
    """A pool per concurrent ``train`` call, started on demand and reused; at most ``size`` pools (the ``factory``
    makes pool number n: on a host with GPUs, its ranks on the trainer's n-th set of GPUs for good)."""

    def __init__(self, factory: Callable[[int], TorchPool], size: int | None = None) -> None:
        self._factory, self.size = factory, size
        self._idle: list[TorchPool] = []
        self._all: list[TorchPool] = []
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def acquire(self) -> Iterator[TorchPool]:
        """A pool no other call is using (a live one first), returned to the idle list afterwards."""
        with self._cond:
            while not self._idle and self.size is not None and len(self._all) >= self.size:
                self._cond.wait()
            if self._idle:
                live = [p for p in self._idle if p.alive]
                pool = live[-1] if live else self._idle[-1]
                self._idle.remove(pool)
            else:
                pool = self._factory(len(self._all))  # (the pool's number: its GPUs, where a host has them)
                self._all.append(pool)
        try:
            yield pool
        finally:
            with self._cond:
                self._idle.append(pool)
                self._cond.notify()

    @property
    def pools(self) -> list[TorchPool]:
        with self._cond:
            return list(self._all)

    def close(self) -> None:
        """Stop every pool (a call still running on one fails); they relaunch if used again."""
        for pool in self.pools:
            pool.stop()


def warm_pools(trainer: Any) -> WarmPools:
    """The torch trainer's warm local pools (given by the torch plug-in as ``pools``): a pool per concurrent call, at
    most ``trainer.pool_size``, each the trainer's launcher serving (``serve_command``) with its split
    (``save_arrays``), environment and threads."""
    return WarmPools(lambda number: TorchPool(trainer.serve_command, trainer.save_arrays,
                                              lambda: trainer.environment(trainer.gpu_group(number)),
                                              trainer.threads_per_rank, trainer.scratch_dir), trainer.pool_size)


@atexit.register
def _stop_all() -> None:
    """Never leave ranks behind at interpreter exit (rank 0 also watches the owner pid)."""
    for pool in list(_live):
        with contextlib.suppress(Exception):
            pool.stop(graceful=False)


__all__ = ["TorchPool", "WarmPools", "warm_pools"]
