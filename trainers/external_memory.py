"""XGBoost's external memory, for a table in parts bigger than this machine's memory (no Dask).

``ExtMemQuantileDMatrix`` reads the table through an iterator over its parts, one part at a time: each part is read
and encoded by the job's layout (``trainers.layout.read_part``, as a Dask worker reads its own) and split by its rows'
keys, its training rows handed to XGBoost, which sketches them and writes its quantised pages to a cache folder on
disk; training then streams those pages. The validation rows go to the same folder, a file per part, and are scored
a part at a time. What stays in memory: one part being read, XGBoost's page in use, the validation labels and
predictions; the cache on disk is about the size of the table.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.layout import check_sides, read_batches

log = logging.getLogger(__name__)

#: without ``--external-memory``, a table whose files exceed this share of the machine's memory trains from disk
AUTO_SHARE = 0.5


def chosen(table: Any, asked: bool) -> bool:
    """External memory: when asked (``--external-memory``), or when the table's files exceed ``AUTO_SHARE`` of the
    machine's memory (one line says so)."""
    if asked:
        return True

    total = psutil.virtual_memory().total
    if table.size > AUTO_SHARE * total:
        log.warning("the table's %.1f GB of files exceed %d%% of this machine's %.1f GB of memory: trained from disk "
                    "(XGBoost's external memory), as with --external-memory", table.size / 1e9, AUTO_SHARE * 100,
                    total / 1e9)
        return True
    return False


def give_back_freed() -> None:
    """glibc's ``malloc_trim``: the heap a trial-rung freed goes back to the OS. Training from disk frees
    many blocks under ``M_MMAP_THRESHOLD`` (XGBoost's pages and histograms, in a new thread's arena per trial-rung):
    measured on a 1 GB table, each trial-rung left 50-110 MB in the arenas (244 -> 466 MB over three), all of it
    given back by a trim, which takes milliseconds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its own allocator's policy
        pass


class Matrix:
    """The table's training rows as an ``ExtMemQuantileDMatrix`` cached under ``folder``, and its validation rows in
    files beside it (``predict`` reads them a part at a time)."""

    def __init__(self, table: Any, layout: Any, seed: int, fraction: float, nthread: int) -> None:
        import xgboost as xgb

        self.folder = Path(tempfile.mkdtemp(prefix="hyperband-extmem-"))
        self._removed = weakref.finalize(self, shutil.rmtree, self.folder, True)  # at close, collection or exit
        began = time.perf_counter()
        parts = _Parts(table, layout, seed, fraction, self.folder)
        try:
            self.dtrain = xgb.ExtMemQuantileDMatrix(parts, nthread=nthread)
        except xgb.core.XGBoostError as exc:
            self.close()
            raise InputError(f"XGBoost's external memory refused {table.url}: {str(exc).splitlines()[0]}") from None
        except BaseException:
            self.close()
            raise
        self.validation = parts.validation
        self.y_val = np.concatenate(parts.labels) if parts.labels else np.zeros(0)
        seen = (np.asarray(sorted(parts.train_classes)) if layout.task != "regression"
                else np.zeros(min(1, parts.train_rows)))
        try:
            check_sides(seen, self.y_val, layout.task, len(layout.classes), layout.target, fraction)
        except InputError:
            self.close()
            raise
        log.info("external memory: %d part(s) of %s sketched and cached in %s in %.2f s (%d training, %d validation "
                 "rows)", len(table.parts), table.url, self.folder, time.perf_counter() - began, parts.train_rows,
                 len(self.y_val))

    def predict(self, predict: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``predict`` of every validation row, a part's file at a time, in the labels' order."""
        rows = (np.load(path) for path in self.validation)
        out = [np.asarray(predict(X)) for X in rows if len(X)]
        return np.concatenate(out) if out else np.zeros(0)

    def close(self) -> None:
        self.dtrain = None
        self._removed()


def _Parts(table: Any, layout: Any, seed: int, fraction: float, folder: Path) -> Any:
    """The iterator ``ExtMemQuantileDMatrix`` reads (several passes): a part's training rows per batch; the first
    pass also writes each part's validation rows to ``folder``."""
    import xgboost as xgb

    class Parts(xgb.DataIter):
        def __init__(self) -> None:
            super().__init__(cache_prefix=str(folder / "cache"), release_data=True, on_host=False)
            self.i, self.first = 0, True
            self.validation: list[Path] = []
            self.labels: list[np.ndarray] = []
            self.train_classes: set[Any] = set()
            self.train_rows = 0

        def next(self, input_data: Callable[..., None]) -> bool:
            if self.i == len(table.parts):
                return False
            batches = list(read_batches(table, table.parts[self.i], layout, seed, fraction))
            X, y, X_val, y_val = (np.concatenate([b[k] for b in batches]) for k in range(4))
            del batches
            pyarrow.default_memory_pool().release_unused()  # Arrow's allocator keeps what a part's read freed
            if self.first:
                path = folder / f"validation-{self.i:05d}.npy"
                np.save(path, X_val)
                self.validation.append(path)
                self.labels.append(y_val)
                self.train_rows += len(y)
                if layout.task != "regression":
                    self.train_classes.update(np.unique(y).tolist())
            del X_val
            self.i += 1
            if not len(y):  # a part whose rows all went to validation: nothing to give XGBoost
                return self.next(input_data)
            input_data(data=X, label=y)
            return True

        def reset(self) -> None:
            if self.i:
                self.first = False
            self.i = 0

    return Parts()
