"""The user's training script on a Dask cluster (``--script train.py --dask-address ... --workers N``).

Each trial-rung's N ranks run on a group of N Dask workers (``dask_ranks.DaskRanks``: the torch trainer's groups,
rendezvous and retries): on each worker of the group the script runs as a process with torchrun's environment
contract (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and the
tuner's (``HYPERBAND_*``, as ``trainers/script.py`` documents), exactly as ``torchrun`` would start it, so
``dist.init_process_group()`` finds its peers on the other machines.

Nothing needs a shared folder: the script travels as its bytes (a worker that has the same file at the same
path runs it in place, so its sibling modules import), the trial's checkpoint directory travels as a tar to
every rank and comes back from every rank (files merged, rank 0's last), and rank 0's reports come back with it.
A rank that exits non-zero before the work is done fails the trial-rung with its last lines (after it, the
trainer keeps the result where the checkpoint is complete: ``trainers.exits``); a worker lost mid-trial-rung sends it to
another group.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect_hyperband.executors.dask_ranks import DaskRanks, OnDask
from prefect_hyperband.trainers.script import ScriptFailed, exit_failure, kill_group, reported_at, script_env

#: seconds between looks at a rank's process
POLL = 0.2
#: seconds between looks at the trial-rung's cancel event (an RPC to the scheduler)
CANCEL_POLL = 1.0
#: seconds a rank that ended non-zero waits to hear that rank 0 ended after its last report (torch's abort at exit)
RACE_WAIT = 10.0


def _event(name: str | None) -> Any:
    if not name:
        return None
    from distributed import Event

    return Event(name)


def shipped(path: str) -> dict[str, Any]:
    """A file of the user's code as a job carries it to the workers (``code_here`` reads it there)."""
    source = Path(path).read_bytes()
    return {"script": path, "source": source, "sha256": hashlib.sha256(source).hexdigest()}


def code_here(job: Mapping[str, Any], tmp: Path) -> Path:
    """The user's file on this worker: in place when the worker has the same file at the same path (its sibling
    modules then import), else the job's copy written under ``tmp``."""
    path = Path(job["script"])
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == job["sha256"]:
        return path
    copy = Path(tmp, "code", path.name)
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(job["source"])
    return copy


def pack(directory: Path) -> bytes:
    """A directory's files as tar bytes (empty when it does not exist)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if directory.is_dir():
            for path in sorted(directory.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(directory)))
    return buffer.getvalue()


def unpack(data: bytes, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(directory, filter="data")  # no absolute paths, no links out of the directory


def script_rank(job: Mapping[str, Any], env: Mapping[str, str], data: Any, previous: bytes | None,
                timeout: float) -> dict[str, Any]:
    """One rank of one trial-rung, in a Dask worker: run the script under the contract; its checkpoint files,
    and on rank 0 its reports, come back. A non-zero exit raises ``ScriptFailed`` with the rank's last lines."""
    rank = int(env["RANK"])
    with tempfile.TemporaryDirectory(prefix="hyperband-script-") as tmp:
        script = code_here(job, Path(tmp))
        out, reports, log = Path(tmp, "checkpoint"), Path(tmp, "reports.jsonl"), Path(tmp, "rank.log")
        out.mkdir()
        restored = Path(tmp, "previous") if previous is not None else None
        if restored is not None:
            unpack(previous, restored)
        variables = script_env(job["env"], restored, out, reports, **env)
        began = time.monotonic()
        with open(log, "wb") as sink:
            proc = subprocess.Popen([sys.executable, str(script), *job["args"]], stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, env=variables, cwd=str(script.parent), start_new_session=True)
            cancel, looked = _event(job.get("cancel")), began
            try:
                while proc.poll() is None:
                    time.sleep(POLL)
                    now = time.monotonic()
                    if now - began > timeout:
                        raise ScriptFailed(f"rank {rank} timed out after {timeout:g} s")
                    if cancel is not None and now - looked > CANCEL_POLL:
                        looked = now
                        if cancel.is_set():  # the job stopped, or a peer failed: the trial-rung is given up
                            raise ScriptFailed(f"rank {rank} stopped: its trial-rung was given up")
            finally:
                kill_group(proc)  # a timeout, the worker closing: no process of the script left behind
        done = _event(f"{job['cancel']}-rank0-exited") if job.get("cancel") else None
        code = proc.returncode
        if code != 0 and not _after_work(rank, job, reports, done):
            raise ScriptFailed(f"rank {rank} on {env['MASTER_ADDR'] if rank == 0 else 'its worker'} "
                               f"{exit_failure(code, log)}")
        if rank == 0 and done is not None:
            done.set()  # a peer that torch aborts at exit may now keep its result (``_after_work``)
        return {"checkpoint": pack(out), "reports": reports.read_text() if rank == 0 and reports.is_file() else "",
                "log": log.read_bytes()[-200_000:] if rank == 0 else b"", "exit_code": code or None}


def _after_work(rank: int, job: Mapping[str, Any], reports: Path, rank0_done: Any) -> bool:
    """Whether a rank's non-zero exit came after the trial-rung's work (torch's abort at exit, ``trainers.exits``):
    rank 0 once its reports hold the job's metric at the rung's last unit; another rank once rank 0 has ended so
    (its event, waited for ``RACE_WAIT`` seconds). An exit before the work leaves rank 0 waiting in a collective:
    no event, and the rank fails as before (its peers are then cancelled). Whether the checkpoint all ranks sent
    back is complete is the trainer's question (``ScriptTrainer._kept_after_exit``)."""
    if rank == 0:
        return reported_at(reports, job.get("metric", ""), int(job["env"]["HYPERBAND_RESOURCE"]))
    return rank0_done is not None and bool(rank0_done.wait(RACE_WAIT))


def run_script(ranks: Any, trainer: Any, config: Mapping[str, Any], env: Mapping[str, str], checkpoint_dir: Path | None,
               directory: Path, reports: Path, log: Path) -> Any:
    """A script trial-rung on the cluster; every rank's checkpoint files land in ``directory`` (rank 0's last), rank
    0's reports in ``reports`` and its output in ``log``, as the local launcher leaves them. Returns ``Ran``."""
    job = {**shipped(trainer.script), "args": trainer.args(config), "env": dict(env), "metric": trainer.metric}
    previous = pack(checkpoint_dir) if checkpoint_dir is not None else None
    ran = ranks.run(script_rank, job, previous, trainer.timeout or float("inf"))
    for result in reversed(ran.results):  # rank 0's files last: where two ranks wrote one file, rank 0's counts
        unpack(result["checkpoint"], directory)
    reports.write_text(ran.results[0]["reports"])
    log.write_bytes(ran.results[0]["log"])
    return ran


def script_on(address: str) -> Callable[[Any], Any]:
    """The user script's placement on the cluster at ``address``: its ``trainer.workers`` ranks on a group of as
    many workers, meeting at a new port each trial-rung (the script's processes end)."""
    return lambda trainer: OnDask(DaskRanks(address, trainer.workers), run_script)
