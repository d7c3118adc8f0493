"""The user's own training function as a trainer: ``train(trial) -> {metric: value}``.

The function receives a ``Trial``: its ``config``, the ``resource`` (units) this call must reach,
``start`` (units its checkpoint already holds; 0 when fresh), ``checkpoint`` (a directory to resume
from, or None) and ``checkpoint_dir`` (an empty directory to save this call's checkpoint into). It
may call ``trial.report(step, **metrics)`` once per unit; those land on the trial's MLflow run at
their steps. It returns the metrics at ``resource``, which must hold the job's metric as a number.

A checkpoint here is a directory (the user's files) beside a small JSON file (``<dir>.json``: the
units it holds and the metrics returned), which is what the scheduler passes around.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import posixpath
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.base import Placed, Placement, TrainResult
from prefect_hyperband.trainers.gpus import GpuPool

#: callables handed to ``prefect_hyperband.tune`` in this process that have no importable name
_LOCAL: dict[str, Callable[..., Any]] = {}
_LOCAL_LOCK = threading.Lock()
_REPORTS = threading.local()  # the trial whose thread calls ``prefect_hyperband.report``


@dataclass
class Trial:
    """One call of the user's training function: train ``config`` from ``start`` to ``resource`` units."""

    config: dict[str, Any]
    resource: int
    start: int
    checkpoint: str | None
    checkpoint_dir: str
    trial_id: str = ""
    history: list[dict[str, float]] = field(default_factory=list)
    #: the GPUs this call holds (CUDA ids as this process sees them: ``--gpus``); () on the CPU
    gpus: tuple[int, ...] = ()

    @property
    def device(self) -> str:
        """Where to train: ``"cuda:<id>"`` of the call's first GPU, else ``"cpu"`` (``torch.device(trial.device)``)."""
        return f"cuda:{self.gpus[0]}" if self.gpus else "cpu"

    def report(self, step: int, **metrics: float) -> None:
        """Metrics at ``step`` (a unit, 1..resource), logged to the trial's MLflow run at that step.

        Raises ``Stopped`` when the job is stopping (Ctrl-C, SIGTERM, a cancellation): a report is
        where your training gives the job back; the trial-rung is trained again on ``--resume``."""
        if self.checkpoint_dir:
            stopping.check()
        row: dict[str, float] = {"step": int(step)}
        for name, value in metrics.items():
            _check_metric_name(name)
            try:
                row[name] = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"trial.report: metric {name!r} must be a number, got {value!r}") from None
        self.history.append(row)


#: MLflow's rule for a metric's name (``mlflow.utils.validation``, Linux and macOS), and its longest
_METRIC_NAME, MAX_METRIC_NAME = re.compile(r"^[/\w.\- :]*$"), 250


def _check_metric_name(name: str) -> None:
    """A name MLflow takes (its rule and length limit): one it refuses answers 400, which a write takes for a
    server in trouble, retried for minutes while the trial is trained again (found by a fuzz)."""
    if not _METRIC_NAME.match(name):
        raise ValueError(f"trial.report: metric {name!r}: Names may only contain alphanumerics, underscores (_), "
                         "dashes (-), periods (.), spaces ( ), colons (:) and slashes (/)")
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith(("..", "/")):
        raise ValueError(f"trial.report: metric {name!r}: a name MLflow may treat as a file must not resolve to "
                         f"another ({norm!r})")
    if len(name) > MAX_METRIC_NAME:
        raise ValueError(f"trial.report: metric {name[:40]!r}...: {len(name)} characters, MLflow takes at most "
                         f"{MAX_METRIC_NAME}")


def report(step: int, **metrics: float) -> None:
    """``trial.report`` for code that does not hold the ``Trial``: the trial of the calling thread, or in a
    training script (``--script``) the trial-rung that launched it; there only rank 0's reports count."""
    trial = getattr(_REPORTS, "trial", None)
    if trial is not None:
        trial.report(step, **metrics)
        return
    path = os.environ.get("HYPERBAND_REPORT_FILE")
    if not path:
        raise RuntimeError("prefect_hyperband.report() called outside a trial")
    row = Trial({}, 0, 0, None, "")
    row.report(step, **metrics)  # the same checks: numbers only
    if os.environ.get("RANK", "0") != "0":
        return
    with open(path, "a") as fh:  # one line per report, flushed: a killed script keeps what it reported
        fh.write(json.dumps(row.history[0]) + "\n")


def register_local(fn: Callable[..., Any]) -> str:
    """An entry for a callable with no importable name (defined in ``__main__``, a notebook, a closure)."""
    key = f"<local>:{getattr(fn, '__qualname__', 'train')}:{id(fn)}"
    with _LOCAL_LOCK:
        _LOCAL[key] = fn
    return key


def entry_of(fn: Callable[..., Any]) -> str:
    """``module:function`` for an importable function, else a process-local entry."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in name and "." not in name:
        try:
            if getattr(importlib.import_module(module), name, None) is fn:
                return f"{module}:{name}"
        except Exception:
            pass
    return register_local(fn)


def load(entry: str) -> Callable[[Trial], Mapping[str, Any]]:
    """The function named by ``path/to/file.py:function`` or ``package.module:function``; ``InputError`` otherwise."""
    if entry.startswith("<local>:"):
        with _LOCAL_LOCK:
            fn = _LOCAL.get(entry)
        if fn is None:
            raise InputError(f"trainer {entry} was defined in another process; pass it as module:function to resume")
        return _check_signature(fn, entry)
    target, sep, name = entry.rpartition(":")
    if not sep or not target or not name:
        raise InputError(f"--trainer must be path/to/file.py:function or package.module:function, got {entry!r}")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise InputError(f"trainer file {target!r} not found")
        module_name = f"_hyperband_user_{path.stem}_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise InputError(f"trainer file {target!r} cannot be loaded as Python")
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.resolve().parent))  # its own sibling modules import
            try:
                sys.modules[module_name] = module
                with _imported_as_a_library(target):
                    spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(module_name, None)
                raise InputError(f"trainer file {target!r} does not import: {_why(exc)}") from None
            finally:
                sys.path.remove(str(path.resolve().parent))
    else:
        try:
            with _imported_as_a_library(target):
                module = importlib.import_module(target)
        except Exception as exc:
            raise InputError(f"trainer module {target!r} does not import: {_why(exc)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise InputError(f"trainer {entry!r}: {target} has no function {name!r}")
    return _check_signature(fn, entry)


class _ExitedOnImport(Exception):
    """The module's top-level code called ``sys.exit`` (an ``argparse`` parser that refused its arguments, say)."""


@contextlib.contextmanager
def _imported_as_a_library(target: str):
    """The user's module imported as a library is: ``sys.argv`` holds its own name only while its top-level code runs
    (a parser at module level then reads no flags of hyperband's as its own), and its ``sys.exit`` is an error of
    the import, not the job's exit."""
    argv = sys.argv
    sys.argv = [target]
    try:
        yield
    except SystemExit as exc:
        raise _ExitedOnImport(f"its top-level code exited (sys.exit({exc.code!r})); put what runs as a script under "
                              "if __name__ == '__main__':") from None
    finally:
        sys.argv = argv


def _why(exc: Exception) -> str:
    return str(exc) if isinstance(exc, _ExitedOnImport) else f"{type(exc).__name__}: {exc}"


def _check_signature(fn: Any, entry: str) -> Callable[[Trial], Mapping[str, Any]]:
    if not callable(fn):
        raise InputError(f"trainer {entry!r} is not callable")
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise InputError(f"trainer {entry!r} must take one argument, the trial: def train(trial) -> dict") from None
    except ValueError:  # builtins without a signature: let the call tell
        pass
    kind = ("an async def" if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            else "a generator" if inspect.isgeneratorfunction(fn) else None)
    if kind:
        raise InputError(f"trainer {entry!r} is {kind} function; it must return its metrics: def train(trial) -> dict")
    return fn


class FunctionTrainer(Placed):
    """The Trainer protocol over a user function; ``evaluate`` reads the metric the function returned."""

    model = "function"

    def __init__(self, entry: str, metric: str, workers: int = 1,
                 placement: Callable[[FunctionTrainer], Placement] | None = None,
                 gpus: tuple[int, ...] | None = None) -> None:
        self.entry, self.metric, self.workers = entry, metric, workers
        #: this host's GPUs (``trainers.gpus``): a call holds ``workers`` of them, handed to it as ``trial.gpus``
        self.gpu_pool = GpuPool(gpus, workers)
        self.fn = load(entry)
        #: ``log_model(checkpoint_dir) -> ModelInfo`` beside the function in its module, if any: the champion's flavour
        hook = getattr(sys.modules.get(getattr(self.fn, "__module__", "") or ""), "log_model", None)
        self.log_model_hook = hook if callable(hook) else None
        #: with ``--dask-address``: each trial-rung on a free worker of the cluster (``executors.dask_function``)
        self._dask = placement(self) if placement is not None else None


    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        start = _held(checkpoint)
        directory = Path(out).with_suffix("")
        directory.mkdir(parents=True, exist_ok=True)
        trial = Trial(dict(config), resource, start, str(Path(checkpoint).with_suffix("")) if checkpoint else None,
                      str(directory), trial_id=directory.parent.name)
        info: dict[str, float] = {}
        if self._dask is not None:
            previous = Path(checkpoint).with_suffix("") if checkpoint else None
            metrics, trial.history, seconds, ran = self._dask.train(self, trial, previous, directory)
            info = {"lost_worker_seconds": ran.lost_worker_seconds, "attempts": float(ran.attempts),
                    "warm_start": ran.warm}
        else:
            with self.gpu_pool.lease() as gpus:  # (in this process: the ids, not CUDA_VISIBLE_DEVICES)
                trial.gpus = tuple(gpus or ())
                returned, seconds = call(self.fn, trial)
            metrics, info = metrics_of(returned, self.metric), {"gpus": float(len(trial.gpus))}
        write_json_atomic(out, {"resource": resource, "metrics": metrics})
        return TrainResult(str(out), resource, resource - start, seconds, self.workers, history=trial.history, info=info)

    def evaluate(self, checkpoint: str) -> float:
        return self.measure(checkpoint)[0]

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The job's metric, and every metric the code reported with it (for several objectives)."""
        metrics = {k: float(v) for k, v in json.loads(Path(checkpoint).read_text())["metrics"].items()}
        return metrics[self.metric], metrics

    def close(self) -> None:
        """Leave the Dask cluster, if any (in the job's own threads there is nothing to release)."""
        self.leave_placement()


def call(fn: Callable[[Trial], Any], trial: Trial) -> tuple[Any, float]:
    """``fn(trial)`` with ``prefect_hyperband.report`` bound to ``trial``: what it returned, and its seconds."""
    began = time.perf_counter()
    _REPORTS.trial = trial
    try:
        returned = fn(trial)
    except Exception:
        raise
    except BaseException as exc:  # sys.exit, KeyboardInterrupt raised by the code itself (a real Ctrl-C reaches the
        # main thread, not this one): the trial's failure, not the end of the job with its runs left RUNNING
        raise RuntimeError(f"the training function raised {type(exc).__name__}({', '.join(map(repr, exc.args))}); "
                           "it ends this trial only") from None
    finally:
        _REPORTS.trial = None
    return returned, time.perf_counter() - began


def _held(checkpoint: str | None) -> int:
    return int(json.loads(Path(checkpoint).read_text())["resource"]) if checkpoint else 0


def metrics_of(returned: Any, metric: str) -> dict[str, float]:
    """The returned mapping as numbers; the job's metric must be there and finite."""
    if not isinstance(returned, Mapping):
        raise ValueError(f"the trainer must return a dict of metrics holding {metric!r}, got {type(returned).__name__}")
    if metric not in returned:
        raise ValueError(f"the trainer returned no {metric!r} (got {', '.join(map(str, returned)) or 'nothing'})")
    out: dict[str, float] = {}
    for name, value in returned.items():
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {name!r} must be a number, got {value!r}") from None
    if not math.isfinite(out[metric]):
        raise ValueError(f"metric {metric!r} is {out[metric]}")
    return out
