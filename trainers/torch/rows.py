"""The rows a torch rank trains on (``Arrays``): the split the trainer saved (``data.npz``), the arrays themselves (a
Dask worker holds them), or, for a table read in parts (``--data`` a folder, a glob, a Parquet file or a URL), the
rank's own share.

The controller sends the ranks the table's listing and layout (``table_meta``), never its rows: each rank reads its
rows from storage itself (``read_share``: the table's rows in order, cut into as many equal runs as there are ranks,
from the parts' row counts the layout took), with the same split by row key as every other reader
(``layout.read_part``).
What the ranks then agree on needs a collective where the whole table was read before: the standardisation (sums of
every share, ``fit_together``), the steps of an epoch (every rank as many as the largest share, ``ShareSampler``)
and the validation metric (every share's predictions gathered to rank 0, ``gather_scored``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from prefect_hyperband.trainers.layout import Layout, read_part
from prefect_hyperband.trainers.tables import Part, Table

#: the share this process read last: (table digest, rank, world) and its four arrays. A Dask worker runs one rank of
#: every trial-rung of its group, each in a fresh ``Run``: kept here, the group reads its table once per job
_LAST: dict[str, Any] = {"key": None, "arrays": None, "reads": 0}


class Arrays:
    """The rows of one rank (no pandas/sklearn import, no re-splitting per rank): the whole split, or its share."""

    def __init__(self, meta: Mapping[str, Any], rank: int = 0, world: int = 1):
        #: each rank holds its own share of a table read in parts (``read_share``), not every row
        self.shared = "table" in meta
        if self.shared:
            self.X_train, self.y_train, self.X_val, self.y_val = read_share(meta, rank, world)
        elif "file" in meta:
            with np.load(meta["file"]) as npz:
                self.X_train, self.y_train = npz["X_train"], npz["y_train"]
                self.X_val, self.y_val = npz["X_val"], npz["y_val"]
        else:  # the arrays themselves (a Dask worker holds them in memory)
            self.X_train, self.y_train, self.X_val, self.y_val = (meta[k] for k in ("X_train", "y_train", "X_val", "y_val"))
        self.task: str = meta["task"]
        self.n_classes = int(meta["n_classes"])
        shape = meta.get("image_shape")
        self.image_shape = tuple(int(s) for s in shape) if shape else None


def table_meta(table: Any, layout: Any, seed: int, fraction: float) -> dict[str, Any]:
    """What a rank needs to read its share (plain values: a job file's JSON, a Dask task's argument)."""
    return {
        "table": {"url": table.url, "format": table.format, "root": table.root,
                  "parts": [[p.path, p.size, p.stamp] for p in table.parts], "digest": table.digest},
        "layout": layout.to_dict(), "seed": int(seed), "fraction": float(fraction),
        "task": layout.task, "n_classes": layout.n_classes, "image_shape": None,
    }


def owned(part_rows: tuple[int, ...] | list[int], rank: int, world: int) -> list[tuple[int, int, int]]:
    """The rows ``rank`` of ``world`` trains on, as (part, start, stop): the table's rows in order cut into ``world``
    runs of equal length (to a row), so that no rank waits for a larger share; every row on exactly one rank."""
    total = sum(part_rows)
    low, high = rank * total // world, (rank + 1) * total // world
    out, offset = [], 0
    for part, n in enumerate(part_rows):
        start, stop = max(low, offset), min(high, offset + n)
        if start < stop:
            out.append((part, start - offset, stop - offset))
        offset += n
    return out


def read_share(meta: Mapping[str, Any], rank: int, world: int) -> tuple[np.ndarray, ...]:
    """This rank's training and validation rows: ``X_train, y_train, X_val, y_val`` (read once per process and
    table, ``_LAST``)."""
    t = meta["table"]
    key = (t["digest"], rank, world)
    if _LAST["key"] == key:
        return _LAST["arrays"]
    _LAST.update(key=None, arrays=None)  # the previous share goes before this one is read
    table = Table(t["url"], t["format"], tuple(Part(*p) for p in t["parts"]), t["root"])
    layout = Layout.from_dict(meta["layout"])
    pieces = [read_part(table, table.parts[part], layout, int(meta["seed"]), float(meta["fraction"]), rows=(a, b))
              for part, a, b in owned(layout.part_rows, rank, world)]
    if not pieces or not sum(len(p[1]) for p in pieces):
        raise RuntimeError(f"rank {rank} of {world} has no training rows in its share of {t['url']} "
                           f"({layout.rows} rows): give fewer workers or more rows")
    arrays = tuple(np.concatenate([p[i] for p in pieces]) for i in range(4))
    _LAST.update(key=key, arrays=arrays, reads=_LAST["reads"] + 1)
    return arrays


def fit_together(X: np.ndarray, y: np.ndarray, task: str, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """``models.fit_standardisation`` and ``fit_target`` over every rank's share: per-feature mean and std,
    the target's mean and std (regression), from sums all-reduced in float64."""
    X64 = X.astype(np.float64)
    y64 = y.astype(np.float64) if task == "regression" else np.zeros(1)
    sums = np.concatenate([X64.sum(axis=0), (X64 * X64).sum(axis=0), [len(X64), y64.sum(), (y64 * y64).sum()]])
    total = torch.from_numpy(sums).to(device)
    dist.all_reduce(total)
    s = total.cpu().numpy()
    n_features = X.shape[1]
    n = s[2 * n_features]
    mean = s[:n_features] / n
    std = np.sqrt(np.maximum(s[n_features:2 * n_features] / n - mean * mean, 0.0))
    std = np.where(std > 1e-12, std, 1.0)  # constant columns: leave them at 0 after centring
    y_mean, y_std = 0.0, 1.0
    if task == "regression":
        y_mean = float(s[-2] / n)
        y_std = float(np.sqrt(max(s[-1] / n - y_mean * y_mean, 0.0)))
        y_std = y_std if y_std > 1e-12 else 1.0
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32), y_mean, y_std


class ShareSampler:
    """A rank's order over its own share for one epoch: a seeded permutation of its rows, wrapped round to the
    largest share's length so that every rank takes the same number of steps (as ``DistributedSampler`` pads)."""

    def __init__(self, n: int, seed: int, rank: int, world: int):
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, n)
        self.n, self.seed, self.rank = n, seed, rank
        self.num_samples, self.total = max(counts), sum(counts)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self.order().tolist())

    def order(self) -> torch.Tensor:
        """This epoch's order as a tensor (no Python list of every row between the permutation and the device)."""
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + self.epoch * 1_009 + self.rank) % (1 << 63))
        order = torch.randperm(self.n, generator=g)
        repeats = -(-self.num_samples // self.n)
        return order.repeat(repeats)[: self.num_samples]


def gather_scored(prediction: np.ndarray, y: np.ndarray, rank: int, world: int
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """Every rank's validation predictions and labels, at rank 0 (None on the others): the rows stay where they
    were read, only the predictions travel."""
    pieces: list[Any] = [None] * world if rank == 0 else None
    dist.gather_object((prediction, y), pieces, dst=0)
    if rank != 0:
        return None
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


__all__ = ["Arrays", "ShareSampler", "fit_together", "gather_scored", "owned", "read_share", "table_meta"]
