"""PyTorch trainer: data-parallel SGD (DistributedDataParallel) over ``workers`` processes per trial.

One resource unit is one epoch. Each ``train`` call starts ``python -m torch.distributed.run``
as a subprocess in its own session (torch's elastic agent installs signal handlers, which only
work in a main thread, and ``train`` runs in Prefect's worker threads). The ranks run
``trainers.torch.worker``; rank 0 writes the checkpoint and a result file the call reads back.

Port choice: on one machine the launcher gets ``--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0``;
port 0 makes the rendezvous TCP store bind a port the kernel picks while it listens, and the
ranks reuse that store (torch's default agent-store sharing), so two concurrent trials can never
be handed the same port and no probe-then-bind race with other programs exists.

Warm workers (a job's default on one machine, ``warm=False`` for the cold path above): the ranks are
launched once per job and reused by every later call (``executors.torch_pool``): a warm call skips
the ~3-4 s of process launch, torch import, process-group init and data loading, and trains
exactly what a cold launch would (every trial re-seeds from its seed or checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.trainers.base import Placed, Placement, TrainResult, write_sidecar
from prefect_hyperband.trainers.data import (
    DataSpec,
    TrainingRows,
    example_rows,
    metric_direction,
    score,
)
from prefect_hyperband.trainers.exits import failed_ranks, why_kept
from prefect_hyperband.trainers.gpus import GpuPool, env_for
from prefect_hyperband.trainers.launch import failure_message, terminate, torch_launcher
from prefect_hyperband.trainers.torch.checkpoint import (
    checkpoint_epochs,
    load_model,
    predict,
    read_checkpoint,
    timed_predict,
)
from prefect_hyperband.trainers.torch.config import (
    as_float,
    as_int,
    check_metric,
    effective_lr,
    require,
    resolve_config,
)
from prefect_hyperband.trainers.torch.rows import table_meta

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the package (the ranks import it from there)

# ---------------------------------------------------------------------------- the trainer


class TorchTrainer(Placed, TrainingRows):
    """Trainer protocol for PyTorch; one instance per job, shared by its trials (and threads).

    ``threads_per_rank`` defaults to cpu_count // (workers * concurrent_trials): pass the number
    of trials that run at once, since oversubscribed intra-op threads slow small models ~5x.
    ``scratch_dir`` holds each call's job
    folder. Ranks across machines run on a Dask cluster: ``placement`` (``executors.dask_ranks.torch_on``,
    given by the torch plug-in for ``--dask-address``).

    ``pools`` (``executors.torch_pool.warm_pools``, given by the torch plug-in) keeps the ranks alive
    between calls: a pool per concurrent call, at most ``pool_size`` pools (default: one per call running
    at once); ``close()`` stops them. ``warm=False``, or no ``pools``, launches fresh processes for every call.
    """

    #: the module each rank runs (``python -m``); a subclass may wrap it
    worker_module = "prefect_hyperband.trainers.torch.worker"

    model = "torch"

    def __init__(
        self,
        spec: DataSpec,
        workers: int = 1,
        metric: str | None = None,
        seed: int = 0,
        trial_timeout: float = 600.0,
        threads_per_rank: int | None = None,
        concurrent_trials: int = 1,
        scratch_dir: str | None = None,
        warm: bool | None = None,
        pool_size: int | None = None,
        placement: Callable[[TorchTrainer], Placement] | None = None,
        pools: Callable[[TorchTrainer], Any] | None = None,
        gpus: tuple[int, ...] | None = None,
        deterministic: bool = False,
        precision: str = "fp32",
    ):
        self.workers = as_int("workers", workers)
        require(self.workers >= 1, f"workers must be >= 1, got {workers}")
        self.trial_timeout = as_float("trial_timeout", trial_timeout)
        require(self.trial_timeout > 0, f"trial_timeout must be > 0 seconds, got {trial_timeout}")
        concurrent_trials = as_int("concurrent_trials", concurrent_trials)
        require(concurrent_trials >= 1, f"concurrent_trials must be >= 1, got {concurrent_trials}")
        default_threads = max(1, (os.cpu_count() or 1) // (self.workers * concurrent_trials))
        self.threads_per_rank = as_int("threads_per_rank", threads_per_rank or default_threads)
        require(self.threads_per_rank >= 1, f"threads_per_rank must be >= 1, got {threads_per_rank}")
        self._rows_of(spec)  # a table in parts (``trainers.tables``): each rank reads its share, this process its layout
        self.seed = as_int("seed", seed)
        self.scratch_dir = scratch_dir
        self._sample: np.ndarray | None = None
        self.metric = metric or self.info.default_metric
        check_metric(self.metric, self.info.task)
        require(warm is None or isinstance(warm, bool), f"warm must be true or false, got {warm!r}")
        #: warm (the default where the plug-in gives ``pools``, ``executors.torch_pool.warm_pools``): the ranks stay up
        #: between calls; built directly without ``pools``, every call launches them (``warm=True`` then is an error)
        self.warm = pools is not None if warm is None else warm
        require(not (self.warm and pools is None),
               "warm=True needs the warm pools (executors.torch_pool.warm_pools), as the torch plug-in gives them")
        if pool_size is not None:
            pool_size = as_int("pool_size", pool_size)
            require(pool_size >= 1, f"pool_size must be >= 1 (concurrent trials per job), got {pool_size}")
        #: this host's GPUs for the trial-rungs (``trainers.gpus``): a call's ranks take ``workers`` of them
        self.gpu_pool = GpuPool(gpus, self.workers)
        self.deterministic = bool(deterministic)
        require(precision in ("fp32", "bf16"), f"precision must be fp32 or bf16, got {precision!r}")
        self.precision = precision
        if self.gpu_pool.slots:  # a warm pool per set of GPUs, each pool's ranks on its own set for good
            pool_size = min(pool_size or self.gpu_pool.slots, self.gpu_pool.slots)
        self.pool_size = pool_size
        self._pools = pools(self) if self.warm and pools is not None else None
        self._closed = False
        #: with ``--dask-address``: each trial-rung's ranks on a group of the cluster's workers (``executors.dask_ranks``)
        self._dask = placement(self) if placement is not None else None
        if self._dask is not None:
            self.warm = False  # the Dask workers are the warm processes

    def gpu_group(self, number: int) -> tuple[int, ...] | None:
        """Warm pool ``number``'s GPUs: its own set of ``workers`` (None or (): as the trainer's, none placed)."""
        return self.gpu_pool.sets[number] if self.gpu_pool.ids else self.gpu_pool.ids

    @property
    def world_size(self) -> int:
        return self.workers

    # -- protocol ------------------------------------------------------------------------


    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        """Train ``config`` to ``resource`` epochs (resuming ``checkpoint``), checkpoint to ``out``."""
        started = time.perf_counter()
        cfg = resolve_config(config, self.seed)
        resource = as_int("resource", resource)
        require(resource >= 1, f"resource (epochs) must be >= 1, got {resource}")
        start = checkpoint_epochs(checkpoint) if checkpoint else 0
        require(resource >= start, f"resource {resource} is below the {start} epochs checkpoint {checkpoint} holds")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        if checkpoint and resource == start:
            return self._unchanged(checkpoint, out, resource, started)
        if self._dask is not None:
            result = self._dask.train(self, self._job(cfg, resource, checkpoint, out, None), checkpoint, out,
                                      self.trial_timeout)
        elif self.warm:
            result = self._run_warm(cfg, resource, checkpoint, out)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="torch-trial-", dir=self.scratch_dir))
            try:
                result = self._run(cfg, resource, checkpoint, out, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        write_sidecar(out, resource)
        lost = float(result.get("lost_worker_seconds", 0.0))  # attempts on a Dask group that lost a worker
        return TrainResult(
            checkpoint=out,
            resource=resource,
            resource_trained=resource - start,
            seconds=time.perf_counter() - started - lost / self.world_size,
            workers=self.world_size,  # every rank: worker-seconds count them all
            history=result["history"],
            info=self._info(cfg, result),
        )

    def evaluate(self, checkpoint: str) -> float:
        """The validation metric of ``checkpoint`` on the whole validation split, computed here."""
        return self.measure(checkpoint)[0]

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The validation metric, and ``predict_ms``: milliseconds per 1,000 validation rows, the model loaded. A
        table's metric is the one its ranks computed on every share (kept in the checkpoint), its latency timed on
        its first 1,000 rows' validation rows."""
        X = self.data.X_val if self._table is None else self._timed_rows()
        prediction, seconds = timed_predict(checkpoint, X)
        latency = {"predict_ms": seconds * 1e6 / max(1, len(X))}
        worst = 0.0 if metric_direction(self.metric) == "max" else math.inf
        if self._table is not None:
            value = read_checkpoint(checkpoint).get("validation")
            return (worst if value is None or not math.isfinite(value) else float(value)), latency
        if not np.all(np.isfinite(prediction)):
            return worst, latency
        return score(self.metric, self.data.y_val, prediction), latency

    def _timed_rows(self) -> np.ndarray:
        """A table's rows ``predict_ms`` is timed on, read once (not a listing and a read per trial-rung)."""
        if self._sample is None:
            self._sample = example_rows(self.spec, self._table, 1000)
        return self._sample

    def load_model(self, checkpoint: str) -> torch.nn.Module:
        return load_model(checkpoint)

    def predict(self, checkpoint: str, X: np.ndarray) -> np.ndarray:
        return predict(checkpoint, X)

    def close(self) -> None:
        """Stop the warm pools (no rank process is left); safe to call any number of times."""
        self._closed = True
        if self._pools is not None:
            self._pools.close()
        self.leave_placement()

    @property
    def pools(self) -> list[Any]:
        """The warm pools started so far (live or stopped)."""
        return self._pools.pools if self._pools is not None else []

    # -- launching ---------------------------------------------------------------------------

    def launch_command(self, job_path: str) -> list[str]:
        """The ``torch.distributed.run`` command line of one trial."""
        return self._launcher(["--job", job_path])

    def serve_command(self, pool_dir: Path) -> list[str]:
        """The command line of a warm pool: ranks serve ``pool_dir``."""
        return self._launcher(["--serve", str(pool_dir), "--owner", str(os.getpid())])

    def _launcher(self, worker_args: list[str]) -> list[str]:
        """torch's launcher on this machine, with a rendezvous of its own (ranks across machines: ``dask_address``)."""
        return [
            *torch_launcher(),
            "--nnodes", "1",
            "--nproc-per-node", str(self.workers),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", uuid.uuid4().hex,
            "--max-restarts", "0",
            "--monitor-interval", "0.1",
            "-m", self.worker_module, *worker_args,
        ]  # fmt: skip

    def environment(self, gpus: tuple[int, ...] | None = None) -> dict[str, str]:
        """The ranks' environment: the threads, these GPUs (``CUDA_VISIBLE_DEVICES``: local rank k on ``cuda:k``),
        cuBLAS's deterministic workspace with ``deterministic``."""
        env = {**os.environ, **env_for(gpus)}
        if self.deterministic:
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        env["OMP_NUM_THREADS"] = str(self.threads_per_rank)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    def _job(
        self, cfg: Mapping[str, Any], resource: int, checkpoint: str | None, out: str, workdir: Path | None
    ) -> dict:
        """The job a rank trains; a warm pool holds the data already and sets ``workdir`` itself."""
        return {
            "data": self.save_arrays(workdir) if workdir is not None else None,
            "config": dict(cfg),
            "seed": cfg["seed"],
            "resource": resource,
            "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
            "out": str(Path(out).resolve()),
            "workdir": str(workdir.resolve()) if workdir is not None else None,
            "metric": self.metric,
            "effective_lr": effective_lr(cfg, self.world_size),
            "threads_per_rank": self.threads_per_rank,
            "deterministic": self.deterministic,
            "precision": self.precision,
        }

    def arrays(self) -> dict[str, Any]:
        """The split the ranks train on, in memory; a table's listing and layout, each rank reading its share."""
        if self._table is not None:
            return table_meta(self._table, self.info, self.spec.seed, self.spec.validation_fraction)
        ds = self.data
        return {"X_train": ds.X_train, "y_train": ds.y_train, "X_val": ds.X_val, "y_val": ds.y_val,
                "task": ds.task, "n_classes": ds.n_classes,
                "image_shape": list(ds.image_shape) if ds.image_shape is not None else None}

    def save_arrays(self, workdir: Path) -> dict[str, Any]:
        """Write the split the ranks train on beside the job."""
        split = self.arrays()
        if "table" in split:
            return split
        path = workdir / "data.npz"
        np.savez(path, **{k: split.pop(k) for k in ("X_train", "y_train", "X_val", "y_val")})
        return {"file": str(path.resolve()), **split}

    def _run_warm(self, cfg: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> dict:
        """Train on a warm pool (launched on first use, relaunched after a failure)."""
        with self._pools.acquire() as pool:
            return pool.run(self._job(cfg, resource, checkpoint, out, None), self.trial_timeout)

    def _run(self, cfg: Mapping[str, Any], resource: int, checkpoint: str | None, out: str, workdir: Path) -> dict:
        """Launch the ranks, wait (bounded by ``trial_timeout``), and read rank 0's result file."""
        job = self._job(cfg, resource, checkpoint, out, workdir)
        job_path = str(workdir / "job.json")
        command = self.launch_command(job_path)
        job["launched_at"] = time.time()
        write_json_atomic(job_path, job)
        with open(workdir / "launcher.log", "wb") as log, self.gpu_pool.lease() as gpus:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.environment(gpus), start_new_session=True,
            )  # fmt: skip
            try:
                code: int | None = proc.wait(timeout=self.trial_timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                terminate(proc, job_path)
        if code is None:
            raise RuntimeError(failure_message(workdir, f"torch trial timed out after {self.trial_timeout:g} s; killed"))
        result_path = workdir / "result.json"
        if code != 0 and not result_path.is_file():
            raise RuntimeError(failure_message(workdir, f"torch trial failed: launcher exited with code {code}"))
        if not result_path.is_file():
            raise RuntimeError(failure_message(workdir, "torch trial ended without a result from rank 0"))
        result = json.loads(result_path.read_text())
        if code != 0:  # a rank aborted at exit (``trainers.exits``) after rank 0 wrote its checkpoint, then its result
            failed = failed_ranks((workdir / "launcher.log").read_text(errors="replace")) or [(0, code)]
            result.update(exit_race_rank=float(failed[0][0]), exit_code=float(failed[0][1]),
                          exit_kept=why_kept(*failed[0], resource, "its checkpoint and result were written whole"))
        return result

    def _info(self, cfg: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, float]:
        world = int(result["world_size"])
        return {
            "startup_seconds": float(result["startup_seconds"]),
            "setup_seconds": float(result["setup_seconds"]),
            "train_seconds": float(result["train_seconds"]),
            "epoch_seconds": float(result["epoch_seconds"]),
            **({"pass_seconds": float(result["pass_seconds"])} if "pass_seconds" in result else {}),
            "world_size": world,
            "per_replica_batch_size": int(cfg["batch_size"]),
            "global_batch_size": int(cfg["batch_size"]) * world,
            "effective_lr": effective_lr(cfg, world),
            "threads_per_rank": self.threads_per_rank,
            "warm_start": float(result.get("warm_start", 0.0)),
            **({"train_rows": int(result["train_rows"])} if "train_rows" in result else {}),  # every rank's together
            **({"lost_worker_seconds": float(result["lost_worker_seconds"]), "attempts": float(result["attempts"])}
               if "attempts" in result else {}),
            **{k: result[k] for k in ("exit_race_rank", "exit_code", "exit_kept", "gpus",
                                                   "deterministic", "device", "visible") if k in result},
        }

    def _unchanged(self, checkpoint: str, out: str, resource: int, started: float) -> TrainResult:
        """A trial already at ``resource``: copy its checkpoint, train nothing."""
        if Path(checkpoint).resolve() != Path(out).resolve():
            shutil.copyfile(checkpoint, out)
        write_sidecar(out, resource)
        return TrainResult(out, resource, 0, time.perf_counter() - started, self.workers)


__all__ = ["TorchTrainer", "load_model", "predict"]
