"""Tune your own training script: a PyTorch MLP on the digits data, data-parallel (DDP) under torch's launcher.

One resource unit is one epoch. The tuner runs this file as
``python -m torch.distributed.run --nproc-per-node WORKERS ddp_digits.py --lr 0.01 --hidden 64 ...``
and tells it, through the environment, how far to train and where the checkpoints are:

* ``HYPERBAND_RESOURCE``: train up to this epoch; ``HYPERBAND_START``: epochs the checkpoint holds;
* ``HYPERBAND_CHECKPOINT``: the directory to resume from (unset when the trial is fresh);
* ``HYPERBAND_CHECKPOINT_DIR``: where to save this call's checkpoint.

Every rank trains on its shard of each epoch (``DistributedSampler``, reshuffled per epoch by the
epoch number, so 3 epochs then 6 more equal 9 at once); rank 0 evaluates on the whole validation set,
reports with ``prefect_hyperband.report(epoch, ...)`` and saves the checkpoint. Run it with::

    hyperband tune --script examples/ddp_digits.py --workers 2 --space examples/ddp_space.yaml \\
        --metric val_accuracy --direction maximize --min-resource 1 --max-resource 9 --eta 3

It also runs on its own, without the tuner: ``torchrun --nproc-per-node 2 examples/ddp_digits.py --epochs 5``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
    return (TensorDataset(torch.from_numpy(X_train), torch.from_numpy(y_train)),
            torch.from_numpy(X_val), torch.from_numpy(y_val))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--epochs", type=int, default=5, help="without the tuner: epochs to train")
    args = parser.parse_args()

    resource = int(os.environ.get("HYPERBAND_RESOURCE", args.epochs))
    start = int(os.environ.get("HYPERBAND_START", 0))
    resume_from = os.environ.get("HYPERBAND_CHECKPOINT")
    save_to = os.environ.get("HYPERBAND_CHECKPOINT_DIR")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    dist.init_process_group("gloo")  # CPU; "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if resume_from:  # a promotion: continue where the previous rung stopped
        state = torch.load(Path(resume_from) / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    ddp = DistributedDataParallel(model)
    train_set, X_val, y_val = data()
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(start + 1, resource + 1):
        sampler.set_epoch(epoch)  # the epoch's shuffle depends on the epoch only: resuming equals training at once
        ddp.train()
        for X, y in loader:
            optimizer.zero_grad()
            loss_fn(ddp(X), y).backward()
            optimizer.step()
        if rank == 0:
            model.eval()
            with torch.no_grad():
                logits = model(X_val)
                val_loss = float(loss_fn(logits, y_val))
                val_accuracy = float((logits.argmax(1) == y_val).float().mean())
            report(epoch, val_loss=val_loss, val_accuracy=val_accuracy, world_size=world)
    if rank == 0 and save_to:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(save_to) / "state.pt")
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown. On torch 2.13 with gloo, a collective's work object can
    # still be held by gloo's thread and be freed while Python finalizes, which aborts the rank
    # ("terminate called without an active exception", SIGABRT) after all its work is done: 5 of 93
    # plain runs of this script here, 0 of 50 with this exit (pytorch/pytorch#179291 describes the race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report(epoch: int, **metrics: float) -> None:
    if os.environ.get("HYPERBAND_REPORT_FILE"):
        import prefect_hyperband as hb

        hb.report(epoch, **metrics)
    else:
        print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)


if __name__ == "__main__":
    main()
