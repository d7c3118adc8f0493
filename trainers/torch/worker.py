"""One rank of a torch trial, started by ``torch.distributed.run``.

Cold (``-m trainers.torch.worker --job JOB``): the job file (written by ``TorchTrainer.train``)
says what to train, and ``data.npz`` beside it holds the split (so no rank imports
pandas/scikit-learn or re-splits); rank 0 writes the new checkpoint to ``job["out"]`` and a
``result.json`` (history, timings) into the job's folder, then every rank exits.

Warm (``--serve DIR --owner PID``, see ``executors.torch_pool``): the ranks import torch, join the
process group and load ``DIR/data.npz`` once, then loop: rank 0 waits for ``DIR/request-<n>.json``,
broadcasts it, every rank trains it exactly as a cold rank would (same seeding, same code), and
rank 0 writes ``DIR/result-<n>.json``. Any error ends every rank (the pool is relaunched).

Each rank sends its stderr to ``rank<N>.stderr`` in that folder so the trainer can quote it.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import inspect
import math
import os
import sys
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.trainers.exits import lost_a_peer
from prefect_hyperband.trainers.torch import rows as torch_rows
from prefect_hyperband.trainers.torch.device import device_for, join, set_deterministic
from prefect_hyperband.trainers.torch.models import (
    build_model,
    fit_standardisation,
    fit_target,
    learning_rate,
    loss_function,
    predictions,
    safe_score,
)
from prefect_hyperband.trainers.torch.requests import next_request, read_job
from prefect_hyperband.trainers.torch.rng import rng_state, seed_rank, set_rng_state
from prefect_hyperband.trainers.torch.rows import Arrays

CHECKPOINT_FORMAT = 1
#: The standardisation buffers never change: no buffer broadcast before every forward
#: (torch >= 2.12 renamed ``broadcast_buffers`` and warns about the old name).
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


# ---------------------------------------------------------------------------- job and data


def architecture(ds: Arrays, config: Mapping[str, Any]) -> dict[str, Any]:
    """Plain-typed description of the network, stored in the checkpoint."""
    n_outputs = 1 if ds.task == "regression" else ds.n_classes
    return {
        "kind": "cnn" if ds.image_shape is not None else "mlp",
        "n_features": int(ds.X_train.shape[1]),
        "n_outputs": int(n_outputs),
        "width": int(config["width"]),
        "dropout": float(config["dropout"]),
        "image_shape": list(ds.image_shape) if ds.image_shape is not None else None,
        "task": ds.task,
    }


# ---------------------------------------------------------------------------- training


class Run:
    """The state of one rank: data, model, optimiser, sampler."""

    def __init__(
        self, job: Mapping[str, Any], rank: int, world_size: int, device: torch.device, ds: Arrays | None = None
    ):
        self.job, self.rank, self.world_size, self.device = job, rank, world_size, device
        self.config = job["config"]
        self.seed = int(job["seed"])
        self.ds = ds if ds is not None else Arrays(job["data"], rank, world_size)
        X, y = self.ds.X_train, self.ds.y_train
        checkpoint = self._read_checkpoint(job.get("checkpoint"))
        if checkpoint is None:
            self.arch = architecture(self.ds, self.config)
            if self.ds.shared:
                mean, std, y_mean, y_std = torch_rows.fit_together(X, y, self.ds.task, device)
            else:
                mean, std = fit_standardisation(X, image=self.ds.image_shape is not None)
                y_mean, y_std = fit_target(y, self.ds.task)
            self.stats = {"mean": mean, "std": std, "y_mean": y_mean, "y_std": y_std}
        else:
            self.arch, self.stats = checkpoint["arch"], checkpoint["standardisation"]
        self.task = self.arch["task"]
        self.X = torch.from_numpy(np.ascontiguousarray(X)).to(device)
        self.y = self._target(y).to(device)
        self.X_val = torch.from_numpy(np.ascontiguousarray(self.ds.X_val)).to(device)
        self.model, self.optimizer = self._build(checkpoint)
        self.start_epoch = int(checkpoint["epoch"]) if checkpoint else 0
        self._restore_rng(checkpoint)
        self.sampler = torch_rows.ShareSampler(len(self.X), self.seed, rank, world_size) if self.ds.shared else (
            DistributedSampler(range(len(self.X)), num_replicas=world_size, rank=rank, shuffle=True, seed=self.seed,
                               drop_last=False))
        #: every rank's training rows together (a share's sampler counts them all)
        self.train_rows = getattr(self.sampler, "total", len(self.X))
        self.batch_size = int(self.config["batch_size"])
        self.steps_per_epoch = math.ceil(self.sampler.num_samples / self.batch_size)
        self.loss_fn = loss_function(self.task)
        self.bf16 = job.get("precision") == "bf16"

    def _read_checkpoint(self, path: str | None) -> dict[str, Any] | None:
        if not path:
            return None
        return torch.load(path, map_location="cpu", weights_only=True)

    def _target(self, y: np.ndarray) -> torch.Tensor:
        if self.task == "regression":
            return torch.from_numpy(((y - self.stats["y_mean"]) / self.stats["y_std"]).astype(np.float32)).unsqueeze(1)
        return torch.from_numpy(y.astype(np.int64))

    def _build(self, checkpoint: Mapping[str, Any] | None):
        torch.manual_seed(self.seed)  # identical initialisation on every rank (DDP broadcasts rank 0's anyway)
        model = build_model(self.arch)
        model.set_standardisation(self.stats["mean"], self.stats["std"])
        if checkpoint is not None:
            model.load_state_dict(checkpoint["model"])
        model.to(self.device)
        self.net = model  # the network itself (its checkpoint, its validation)
        ids = [self.device.index] if self.device.type == "cuda" else None
        # one rank: no DDP (its all-reduce of every step's gradients with itself costs ~20 % of a small model's step)
        ddp = DistributedDataParallel(model, device_ids=ids, **NO_BUFFER_SYNC) if self.world_size > 1 else model
        optimizer = torch.optim.SGD(
            ddp.parameters(),
            lr=float(self.job["effective_lr"]),
            momentum=float(self.config["momentum"]),
            weight_decay=float(self.config["weight_decay"]),
        )
        if checkpoint is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
        return ddp, optimizer

    def _restore_rng(self, checkpoint: Mapping[str, Any] | None) -> None:
        states = (checkpoint or {}).get("rng", {}).get("ranks", [])
        if checkpoint is not None and self.rank < len(states):
            set_rng_state(states[self.rank])
        else:
            seed_rank(self.seed, self.rank, self.start_epoch)

    def train_epoch(self, epoch: int) -> float:
        """One pass over this rank's shard; returns the mean training loss over all ranks."""
        self.sampler.set_epoch(epoch)
        self.model.train()
        order = (self.sampler.order() if isinstance(self.sampler, torch_rows.ShareSampler)
                 else torch.tensor(list(iter(self.sampler)), dtype=torch.int64)).to(self.device)
        losses: list[torch.Tensor] = []  # on the device, summed once an epoch: no host sync (nor kernel) per step
        lr0, warmup, groups = float(self.job["effective_lr"]), int(self.config["warmup_epochs"]), self.optimizer.param_groups
        for group in groups:  # after the warm-up, constant: written once an epoch (a resumed optimizer's included)
            group["lr"] = lr0
        cast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if self.bf16 else contextlib.nullcontext
        for step, batch in enumerate(order.split(self.batch_size)):
            if epoch < warmup:
                lr = learning_rate(lr0, warmup, epoch, step, self.steps_per_epoch)
                for group in groups:
                    group["lr"] = lr
            with cast():  # --precision bf16: autocast (fp32: nothing entered)
                loss = self.loss_fn(self.model(self.X[batch]), self.y[batch])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(loss.detach())
        rows = [float(min(self.batch_size, len(order) - i)) for i in range(0, len(order), self.batch_size)]
        loss_sum = (torch.stack(losses).double() * torch.tensor(rows, dtype=torch.float64, device=self.device)).sum() \
            if losses else torch.zeros((), dtype=torch.float64, device=self.device)
        total = torch.stack([loss_sum, torch.tensor(float(len(order)), dtype=torch.float64, device=self.device)])
        if self.world_size > 1:
            dist.all_reduce(total)
        return float(total[0] / total[1])

    def validate(self) -> float | None:
        """The validation metric on the whole validation split: rank 0's alone (no collective), or with every rank's
        share of a table, gathered to rank 0 (the others get None)."""
        module = self.net
        module.eval()
        with torch.no_grad():
            out = module(self.X_val).cpu()
        module.train()
        pred, y = predictions(out, self.task, float(self.stats["y_mean"]), float(self.stats["y_std"])), self.ds.y_val
        if self.ds.shared:
            gathered = torch_rows.gather_scored(pred, y, self.rank, self.world_size)
            if gathered is None:
                return None
            pred, y = gathered
        return safe_score(self.job["metric"], y, pred)

    def checkpoint(self, epoch: int, rng: list[dict[str, Any]]) -> dict[str, Any]:
        model = self.net
        return {
            "format": CHECKPOINT_FORMAT,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "epoch": int(epoch),
            "arch": dict(self.arch),
            "standardisation": {
                "mean": self.stats["mean"].cpu(),
                "std": self.stats["std"].cpu(),
                "y_mean": float(self.stats["y_mean"]),
                "y_std": float(self.stats["y_std"]),
            },
            "rng": {"world_size": self.world_size, "ranks": rng},
            "config": dict(self.config),
            "metric": self.job["metric"],
            "seed": self.seed,
        }


def save_atomic(payload: Mapping[str, Any], path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(dict(payload), tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- process


def redirect_stderr(path: Path) -> None:
    """Point fd 2 at ``path`` so a crash (even a segfault, via faulthandler) leaves its message there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()


def train_job(
    job: Mapping[str, Any], rank: int, world_size: int, device: torch.device, backend: str, ds: Arrays | None = None
) -> None:
    """Train one job on a joined process group: rank 0 writes the checkpoint and the result file.

    Everything that decides the numbers (initial weights, dropout/sampler RNG) is seeded from the
    job or restored from its checkpoint, so a long-lived rank computes what a fresh one would.
    """
    startup = time.time() - float(job["launched_at"])
    torch.set_num_threads(int(job["threads_per_rank"]))
    set_deterministic(bool(job.get("deterministic")))
    t0 = time.perf_counter()
    state = Run(job, rank, world_size, device, ds)
    setup_seconds = time.perf_counter() - t0
    history: list[dict[str, float]] = []
    t0, value, pass_seconds = time.perf_counter(), None, 0.0
    for epoch in range(state.start_epoch, int(job["resource"])):
        began = time.perf_counter()
        train_loss = state.train_epoch(epoch)  # (its loss a float: the pass has ended on the device too)
        pass_seconds += time.perf_counter() - began
        if rank == 0 or state.ds.shared:
            value = state.validate()
        if rank == 0:
            history.append({"step": epoch + 1, "train_loss": train_loss, f"val_{job['metric']}": value})
    train_seconds = time.perf_counter() - t0
    rng: list[Any] = [None] * world_size
    dist.all_gather_object(rng, rng_state())
    if rank == 0:
        # the last validation with the model: what ``measure`` reports where the controller holds no rows
        save_atomic({**state.checkpoint(int(job["resource"]), rng), "validation": value}, job["out"])
        epochs = max(1, int(job["resource"]) - state.start_epoch)
        write_json_atomic(
            job.get("result") or Path(job["workdir"]) / "result.json",
            {
                "history": history,
                "startup_seconds": startup,
                "setup_seconds": setup_seconds,
                "train_seconds": train_seconds,
                "epoch_seconds": train_seconds / epochs,
                "pass_seconds": pass_seconds,  # the training passes alone (no validation)
                "world_size": world_size,
                "backend": backend,
                "device": str(device),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpus": float(world_size if device.type == "cuda" else 0),  # GPUs the trial-rung trained on
                "deterministic": float(torch.are_deterministic_algorithms_enabled()),
                "train_rows": state.train_rows,
            },
        )
    dist.barrier()


def run(job: Mapping[str, Any], rank: int, world_size: int, local_rank: int) -> None:
    """Cold path: join the group, train the one job, leave."""
    device, backend = device_for(local_rank)
    join(backend, device)
    dist.barrier()
    train_job(job, rank, world_size, device, backend)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- warm pool

#: The warm pool's collective timeout (a hung job is killed by the trainer well before).
SERVE_PG_TIMEOUT = timedelta(hours=2)


#: A rank that failed only because a peer went away waits this long before exiting (the launcher
#: stops it sooner): the launcher then names the peer, the real cause, as the failed rank.
PEER_FAILURE_DELAY = 3.0


def peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank died (gloo/NCCL connection errors)."""
    if isinstance(exc, getattr(dist, "DistNetworkError", ())):
        return True
    text = str(exc)
    return lost_a_peer(text) or "NCCL" in text


def serve(pool_dir: Path, rank: int, world_size: int, local_rank: int, owner: int) -> None:
    """Warm path: join the group and load the data once, then train the requests one after another."""
    device, backend = device_for(local_rank)
    join(backend, device, timeout=SERVE_PG_TIMEOUT)
    meta = read_job(str(pool_dir / "pool.json"))
    ds = Arrays(meta["data"], rank, world_size)
    torch.set_num_threads(int(meta["threads_per_rank"]))
    idle_seconds = float(meta.get("idle_seconds") or math.inf)
    dist.barrier()
    seq, idle_since = 0, time.monotonic()
    while True:
        message: list[Any] = [next_request(pool_dir, seq, owner, idle_since + idle_seconds) if rank == 0 else None]
        dist.broadcast_object_list(message, src=0)
        job = message[0]
        op = job.get("op", "train")
        if op == "ping":
            continue
        if op == "stop":
            break
        os.ftruncate(2, 0)  # the stderr tail the trainer quotes on failure is this job's only
        try:
            dist.barrier()
            train_job(job, rank, world_size, device, backend, ds)
        except BaseException as exc:  # any error ends the pool: the other ranks are stuck in collectives
            traceback.print_exc()
            sys.stderr.flush()
            if peer_failure(exc):  # let the rank that failed first be the launcher's root cause
                time.sleep(PEER_FAILURE_DELAY)
            os._exit(1)
        seq, idle_since = seq + 1, time.monotonic()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--job", help="train this one job file, then exit (cold)")
    mode.add_argument("--serve", help="pool folder: train its requests one by one until stopped (warm)")
    parser.add_argument("--owner", type=int, default=0, help="with --serve: stop when this pid is gone")
    args = parser.parse_args(argv)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.serve:
        pool_dir = Path(args.serve)
        redirect_stderr(pool_dir / f"rank{rank}.stderr")
        serve(pool_dir, rank, world_size, local_rank, args.owner)
    else:
        job = read_job(args.job)
        redirect_stderr(Path(job["workdir"]) / f"rank{rank}.stderr")
        torch.set_num_threads(int(job["threads_per_rank"]))
        run(job, rank, world_size, local_rank)
    # everything is written and closed: skip the interpreter's (torch's) slow teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
