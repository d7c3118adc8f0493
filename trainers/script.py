"""The user's own training script as a trainer, run under torch's launcher (the SageMaker / Syne Tune contract).

Each trial-rung runs::

    python -m torch.distributed.run --standalone --nproc-per-node <workers> script.py --<name> <value> ...

(with one worker, ``python -u script.py --<name> <value> ...`` with the launcher's contract for rank 0 of 1 in
its environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``),
one ``--name value`` per hyperparameter (all of them also as JSON in ``HYPERBAND_CONFIG``), with
``HYPERBAND_RESOURCE`` (units this call must reach), ``HYPERBAND_START`` (units the checkpoint
holds), ``HYPERBAND_CHECKPOINT`` (a directory to resume from; unset when fresh) and
``HYPERBAND_CHECKPOINT_DIR`` (an empty directory for this call's checkpoint) in its environment.
The script reports with ``prefect_hyperband.report(step, **metrics)``; only rank 0's reports count
(they are appended to ``HYPERBAND_REPORT_FILE``). The trial-rung's score is the job's metric as
reported at step ``HYPERBAND_RESOURCE``. A non-zero exit, a missing report or a NaN fails the trial
with the last lines of the script's output; a run past ``timeout`` seconds is killed. A non-zero exit after the
work is not a failure (torch's abort at exit, ``trainers.exits``): once rank 0 has reported the rung's last unit
and the checkpoint is complete, the result is kept whatever the ranks' exit codes, and the call's ``info`` names
the rank and why (``exit_race_rank``, ``exit_code``, ``exit_kept``); on Dask, each rank's code comes back with
its files (``executors.dask_script``). Every rank runs
in the launcher's own process group, which is killed as a whole: nothing is left behind.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.common.ports import free_port
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.base import Placed, Placement, TrainResult
from prefect_hyperband.trainers.exits import checkpoint_complete, failed_ranks, why_kept
from prefect_hyperband.trainers.gpus import GpuPool, env_for
from prefect_hyperband.trainers.launch import contract, torch_launcher

#: lines of the script's output kept on a failed trial's run
TAIL_LINES = 30


class ScriptFailed(RuntimeError):
    """The script exited non-zero, timed out, or did not report the job's metric."""


class ScriptTrainer(Placed):
    """The Trainer protocol over a training script; ``evaluate`` reads the metric rank 0 reported."""

    model = "script"

    def __init__(self, script: str, metric: str, workers: int = 1, threads: int | None = None,
                 timeout: float | None = None, placement: Callable[[ScriptTrainer], Placement] | None = None,
                 gpus: tuple[int, ...] | None = None) -> None:
        path = Path(script)
        if not path.is_file():
            raise InputError(f"--script {script!r} is not a file")
        if path.suffix != ".py":
            raise InputError(f"--script {script!r} must be a Python file (.py)")
        try:  # a script that cannot run at all is the user's input, said now: not every trial failing on it
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            raise InputError(f"--script {script!r} does not compile: {type(exc).__name__}: {exc}") from exc
        self.script, self.metric, self.workers = str(path.resolve()), metric, workers
        self.threads = max(1, (threads or os.cpu_count() or 1) // workers)  # per rank
        self.timeout = timeout
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        #: this host's GPUs (``trainers.gpus``): a trial-rung's ranks take ``workers`` of them, as CUDA_VISIBLE_DEVICES
        self.gpu_pool = GpuPool(gpus, workers)
        #: with ``--dask-address``: each trial-rung's ranks on a group of the cluster's workers (``executors.dask_script``)
        self._dask = placement(self) if placement is not None else None

    def args(self, config: Mapping[str, Any]) -> list[str]:
        """The script's command-line arguments: ``--name value`` per hyperparameter."""
        argv: list[str] = []
        for name, value in config.items():
            argv += [f"--{name}", json.dumps(value) if isinstance(value, (dict, list, bool)) or value is None else str(value)]
        return argv

    def command(self, config: Mapping[str, Any]) -> list[str]:
        """torch's launcher with ``workers`` ranks; one rank runs as the script itself (``-u``, as the launcher runs
        it), with the launcher's contract in its environment (``_launch``): the launcher's own start (it imports
        torch: 3.6 s of CPU here) is paid by every trial-rung and buys nothing for a single process."""
        if self.workers == 1:
            return [sys.executable, "-u", self.script, *self.args(config)]
        return [*torch_launcher(), "--standalone", "--nnodes", "1",
                "--nproc-per-node", str(self.workers), self.script, *self.args(config)]

    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        start = int(json.loads(Path(checkpoint).read_text())["resource"]) if checkpoint else 0
        directory = Path(out).with_suffix("")
        directory.mkdir(parents=True, exist_ok=True)
        reports, log = directory.with_suffix(".reports.jsonl"), directory.with_suffix(".log")
        reports.unlink(missing_ok=True)  # a retried trial-rung starts its reports afresh
        tuner = {
            "HYPERBAND_CONFIG": json.dumps(dict(config)),
            "HYPERBAND_RESOURCE": str(resource),
            "HYPERBAND_START": str(start),
            "HYPERBAND_TRIAL_ID": directory.parent.name,
            "OMP_NUM_THREADS": str(self.threads),
        }
        previous = Path(checkpoint).with_suffix("") if checkpoint else None
        began = time.perf_counter()
        info: dict[str, float] = {"world_size": float(self.workers),
                                  "gpus": float(self.workers if self.gpu_pool.ids and self._dask is None else 0)}
        if self._dask is not None:
            ran = self._dask.train(self, config, tuner, previous, directory, reports, log)
            info.update(lost_worker_seconds=ran.lost_worker_seconds, attempts=float(ran.attempts),
                        warm_start=ran.warm)
            exited = [(rank, r["exit_code"]) for rank, r in enumerate(ran.results) if r.get("exit_code")]
            if exited:  # ranks that ended non-zero after rank 0's last report (``dask_script.script_rank``)
                info.update(self._kept_after_exit(exited, reports, resource, directory,
                                                  lambda: "last output:\n" + _tail_of(log)))
            seconds = time.perf_counter() - began - ran.lost_worker_seconds / self.workers
        else:
            code = self._launch(config, tuner, previous, directory, reports, log, began)
            seconds = time.perf_counter() - began
            if code != 0:
                failed = failed_ranks(_text_of(log)) or [(0, code)]
                info.update(self._kept_after_exit(failed, reports, resource, directory, lambda: exit_failure(code, log)))
        history = _read_reports(reports)
        at_end = [row for row in history if row["step"] == resource and self.metric in row]
        if not at_end:
            raise ScriptFailed(f"reported no {self.metric!r} at step {resource} (HYPERBAND_RESOURCE); "
                               f"reported steps: {sorted({int(r['step']) for r in history}) or 'none'}")
        metrics = {k: v for k, v in at_end[-1].items() if k != "step"}
        if not math.isfinite(metrics[self.metric]):
            raise ScriptFailed(f"metric {self.metric!r} is {metrics[self.metric]} at step {resource}")
        write_json_atomic(out, {"resource": resource, "metrics": metrics})
        return TrainResult(str(out), resource, resource - start, seconds, self.workers, history=history, info=info)

    def _kept_after_exit(self, failed: list[tuple[int, int]], reports: Path, resource: int, directory: Path,
                         failure: Callable[[], str]) -> dict[str, Any]:
        """What the call's ``info`` says of ranks that exited non-zero (``failed``: rank and code, the first
        the cause) when rank 0 reported ``resource`` and the checkpoint is complete; ``ScriptFailed`` otherwise."""
        if not reported_at(reports, self.metric, resource):
            raise ScriptFailed(failure())
        complete = checkpoint_complete(directory, self.workers)
        if complete is None:
            raise ScriptFailed(f"{failure()}\n(rank 0 reported r={resource}, but the checkpoint in {directory} is "
                               "incomplete: a rank ended before its part was written)")
        rank, code = failed[0]
        return {"exit_race_rank": float(rank), "exit_code": float(code),
                "exit_kept": why_kept(rank, code, resource, complete)}

    def _launch(self, config: Mapping[str, Any], tuner: Mapping[str, str], previous: Path | None, directory: Path,
                reports: Path, log: Path, began: float) -> int:
        """The trial-rung on this machine: ``command``'s process in a session of its own; its exit code."""
        alone = contract(0, 1, 0, 1, "127.0.0.1", free_port()) if self.workers == 1 else {}
        with open(log, "wb") as sink, self.gpu_pool.lease() as gpus:
            env = script_env(tuner, previous, directory, reports, **alone, **env_for(gpus))
            proc = subprocess.Popen(self.command(config), stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
            with self._lock:
                self._running.add(proc)
            try:
                code = _wait(proc, began, self.timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                raise ScriptFailed(f"timed out after {self.timeout:g} s; last output:\n{_tail_of(log)}") from None
            except BaseException:  # the job is stopping (Ctrl-C, a timeout, a cancellation): no rank left behind
                kill_group(proc)
                raise
            finally:
                with self._lock:
                    self._running.discard(proc)
                kill_group(proc)  # ranks the launcher left (it exits when rank 0 does)
        return code

    def evaluate(self, checkpoint: str) -> float:
        return self.measure(checkpoint)[0]

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The job's metric, and every metric the code reported with it (for several objectives)."""
        metrics = {k: float(v) for k, v in json.loads(Path(checkpoint).read_text())["metrics"].items()}
        return metrics[self.metric], metrics

    def close(self) -> None:
        """Kill every launcher still running (a job stopping), with its ranks; leave the Dask cluster."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            kill_group(proc)
        self.leave_placement()


def script_env(tuner: Mapping[str, str], previous: Path | None, directory: Path, reports: Path,
               **extra: str) -> dict[str, str]:
    """The script's environment: this process's, the tuner's contract for the trial-rung (``HYPERBAND_*``, where
    to resume from, save to and report to) and ``extra`` (a rank's torchrun contract on a Dask worker)."""
    env = {**os.environ, **tuner, **extra, "HYPERBAND_CHECKPOINT_DIR": str(directory),
           "HYPERBAND_REPORT_FILE": str(reports), "PYTHONUNBUFFERED": "1"}
    env.pop("HYPERBAND_CHECKPOINT", None)
    if previous is not None:
        env["HYPERBAND_CHECKPOINT"] = str(previous)
    return env


def _wait(proc: subprocess.Popen, began: float, timeout: float | None) -> int:
    """The launcher's exit code; ``Stopped`` as soon as the job stops or gives this trial-rung up."""
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            stopping.check()
            if timeout is not None and time.perf_counter() - began > timeout:
                raise


def kill_group(proc: subprocess.Popen) -> None:
    """The launcher, its process group and every process under it: torch's launcher starts each rank in a
    session of its own, so killing the launcher's group alone leaves the ranks running."""
    ranks = []
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # gone already, or no psutil: the group is what can be reached
        pass
    for pid in [proc.pid, *(r.pid for r in ranks)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _read_reports(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append({k: float(v) for k, v in json.loads(line).items()})
        except (ValueError, TypeError, AttributeError):
            continue  # a half-written last line of a killed rank
    return rows


#: the launcher's line when a rank fails; what follows it is the launcher's own traceback and report
_RANK_FAILED = re.compile(r"\] failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def exit_failure(code: int, log: Path) -> str:
    """The failed rank's exit code and the script's last lines, without the launcher's traceback after them."""
    try:
        text = log.read_bytes()[-200_000:].decode("utf-8", "replace")
    except OSError:
        text = ""
    found = _RANK_FAILED.search(text)
    if found is None:
        reason = f"exited with code {code}; last output:\n{_tail(text)}"
    else:
        tail = _tail(text[: found.start()])
        reason = f"exited with code {found.group(1)} (local rank {found.group(2)}); last output:\n{tail}"
    if _SHUTDOWN_ABORT in text:
        reason += "\n" + SHUTDOWN_HINT
    return reason


#: what a rank prints when torch's gloo thread frees a work object while Python shuts down (SIGABRT, after the
#: script's work is done; pytorch/pytorch#179291)
_SHUTDOWN_ABORT = "terminate called without an active exception"
SHUTDOWN_HINT = ("(an abort before rank 0 reported the rung's last unit, or with its checkpoint incomplete, fails "
                 "the trial; after both, as torch's race at exit, the result is kept)")


def _text_of(log: Path) -> str:
    try:
        return log.read_bytes()[-200_000:].decode("utf-8", "replace")
    except OSError:
        return ""


def reported_at(reports: Path, metric: str, resource: int) -> bool:
    return any(row["step"] == resource and metric in row for row in _read_reports(reports))


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    kept = text.splitlines()
    if kept and "torch/distributed/elastic" in kept[-1]:  # the start of the launcher's failure line
        kept = kept[:-1]
    return "\n".join(kept[-lines:]) or "(no output)"


def _tail_of(log: Path) -> str:
    try:
        return _tail(log.read_bytes()[-20000:].decode("utf-8", "replace"))
    except OSError:
        return "(no output)"
