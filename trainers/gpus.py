"""A host's GPUs as a pool of whole GPUs, like its CPU slots: a trial-rung of N ranks takes N of them for its length.

The ids are CUDA's as this process sees them (``--gpus 0,1,2,3``; by default every visible GPU:
``CUDA_VISIBLE_DEVICES`` where set, else ``nvidia-smi``'s list; no torch import). A trial-rung's processes get its
GPUs as ``CUDA_VISIBLE_DEVICES`` (``env_for``), so its rank of local rank k uses ``cuda:k`` of its own GPUs; code that
runs in this process (XGBoost, a ``--trainer`` function) gets the ids themselves. ``()`` means the CPU only
(``--device cpu``: ``CUDA_VISIBLE_DEVICES`` set empty), ``None`` no placement at all (a machine without GPUs: the
environment is left as it is).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence

from prefect_hyperband.common.errors import InputError

DEVICES = ("auto", "cpu", "cuda")


def parse(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``--gpus``: "0,1,3" (or a list of ints) -> (0, 1, 3); None -> None. One line (InputError) for anything else."""
    if text is None:
        return None
    items = [str(t).strip() for t in (text.split(",") if isinstance(text, str) else text)]
    if not items or not all(i.isdigit() for i in items):
        raise InputError(f"--gpus takes GPU ids separated by commas (e.g. 0,1,2,3), got {text!r}")
    ids = tuple(int(i) for i in items)
    if len(set(ids)) != len(ids):
        raise InputError(f"--gpus names a GPU twice: {text!r}")
    return ids


def visible() -> tuple[int, ...]:
    """This machine's GPUs as CUDA numbers them for this process: ``CUDA_VISIBLE_DEVICES``'s count where set (its
    entries may be UUIDs; CUDA renumbers them 0..n-1), else ``nvidia-smi``'s list; none without a driver."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        entries = [e for e in given.split(",") if e.strip()]
        if any(e.strip().startswith("-") for e in entries):  # CUDA stops at an invalid (negative) id
            entries = entries[: next(i for i, e in enumerate(entries) if e.strip().startswith("-"))]
        return tuple(range(len(entries)))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(range(len([line for line in out.splitlines() if line.strip()])))


def choose(device: str, gpus: str | Sequence[int] | None, ranks: int, on_dask: bool = False) -> tuple[int, ...] | None:
    """The job's GPUs per host from ``--device`` and ``--gpus``: None (no GPU here, nothing placed), () (the CPU,
    asked), or the ids, checked against the ranks a trial-rung needs on one host (one line, before any training)."""
    if device not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        if gpus is not None:
            raise InputError("--device cpu keeps every trial on the CPU; drop --gpus, or use --device cuda")
        return ()
    ids = parse(gpus) if gpus is not None else (None if on_dask else visible())
    if ids is None:  # a Dask cluster's GPUs are its workers' resources (``--resources GPU=1``), not this machine's
        return None
    if not ids:
        if device == "cuda":
            raise InputError("--device cuda: no GPU is visible here (CUDA_VISIBLE_DEVICES, nvidia-smi); "
                             "use --device cpu, or run where a GPU is")
        return None
    if ranks > len(ids):
        raise InputError(f"--workers {ranks} puts a rank on each of {ranks} GPUs of one host, but "
                         f"{_named(gpus, ids)} {len(ids)}; use --workers {len(ids)} or fewer, more GPUs, or --device cpu "
                         "(ranks on the CPU)")
    return ids


def _named(gpus, ids) -> str:
    return "--gpus gives" if gpus is not None else "this host has"


def env_for(ids: tuple[int, ...] | None) -> dict[str, str]:
    """The environment a trial-rung's processes get for its GPUs (none: nothing placed)."""
    return {} if ids is None else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids)}


def groups(ids: tuple[int, ...], per_trial: int) -> list[tuple[int, ...]]:
    """Disjoint sets of ``per_trial`` GPUs: (0,1,2,3) by 2 -> [(0, 1), (2, 3)] (a GPU left over is left idle)."""
    return [ids[i:i + per_trial] for i in range(0, len(ids) - per_trial + 1, per_trial)]


class GpuPool:
    """A host's GPUs shared by the trial-rungs of one trainer: ``lease()`` waits for a free set of ``per_trial``
    GPUs and holds it for the block; with ``ids`` None or () it yields them as they are (no placement, or the CPU)."""

    def __init__(self, ids: tuple[int, ...] | None, per_trial: int) -> None:
        self.ids, self.per_trial = ids, per_trial
        #: its disjoint sets of ``per_trial`` GPUs, in order (a warm pool of number n keeps set n)
        self.sets = groups(ids, per_trial) if ids else []
        self._free = list(self.sets)
        self._cond = threading.Condition()

    @property
    def slots(self) -> int | None:
        """How many trial-rungs can hold GPUs at once (None: no GPU placement)."""
        return len(self.sets) if self.ids else None

    @contextlib.contextmanager
    def lease(self) -> Iterator[tuple[int, ...] | None]:
        if not self.ids:
            yield self.ids
            return
        with self._cond:
            while not self._free:
                self._cond.wait()
            held = self._free.pop(0)
        try:
            yield held
        finally:
            with self._cond:
                self._free.append(held)
                self._cond.notify()


def of_settings(settings) -> tuple[int, ...] | None:
    """A trainer's GPUs on the host that builds it, from its ``TrainerSettings`` (``--gpus``, ``--device``): a task
    worker's host sees its own GPUs."""
    return choose(settings.device, settings.gpus, settings.workers, on_dask=bool(settings.dask_address))
