"""What a Dask worker lost mid-job costs (issue 87): the CLI's job untouched, then with a worker SIGKILLed.

A ``dask scheduler`` and ``--cluster`` one-thread ``dask worker`` processes (each with its nanny, in a process
group of its own) on loopback; ``hyperband tune --dask-address ... --no-baseline`` runs once untouched, then again
with the last worker and its nanny SIGKILLed (a machine lost: no restart) once the job has saved ``--kill-after``
results (``--kill-after`` x 2 ended task runs, a train and an evaluate each), and a replacement worker started
``--replace-after`` seconds later. Printed per job: the exit code, the wall, the MLflow children and how many are
FINISHED, the best trial and score, and the worker-seconds lost; then whether the two bests agree.

Run from the repository root::

    python benchmarks/bench_lost_worker.py                        # xgboost, breast-cancer, R=27, --workers 1
    python benchmarks/bench_lost_worker.py --workers 2 --cluster 3
    python benchmarks/bench_lost_worker.py --model torch --data digits --max-resource 9
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def worker(address: str, name: str, tmp: Path) -> subprocess.Popen:
    return start(["worker", address, "--name", name, "--nthreads", "1", "--no-dashboard", "--memory-limit", "0",
                  "--host", "127.0.0.1"], tmp / f"{name}.log")


def saved(job_dir: Path) -> int:
    """Results the job has saved so far (its snapshot's and its journal's)."""
    from prefect_hyperband.executors.state import saved_rows

    try:
        return len(saved_rows(job_dir)) if job_dir.is_dir() else 0
    except (OSError, ValueError, KeyError):
        return 0


def tune(args, address: str, tmp: Path, job: str, kill=None) -> dict:
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    command = [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", args.model, "--data", args.data,
               "--dask-address", address, "--workers", str(args.workers), "--max-resource", str(args.max_resource),
               "--no-baseline", "--job-dir", str(tmp / "jobs"), "--job-id", job, "--tracking-uri", uri,
               "--experiment", job, "--json"]
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(tmp / f"{job}.log", "w"), text=True)
    killed = kill(tmp / "jobs" / job, proc) if kill else None
    out, _ = proc.communicate()
    wall = time.monotonic() - began
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(job)
    runs = client.search_runs([exp.experiment_id], max_results=5000) if exp else []
    parent = next((r for r in runs if "mlflow.parentRunId" not in r.data.tags), None)
    children = [r for r in runs if parent and r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    result = json.loads(out) if out.strip().startswith("{") else {}
    best = result.get("best") or {}
    return {"job": job, "exit": proc.returncode, "wall": wall, "children": len(children),
            "finished": sum(r.info.status == "FINISHED" for r in children), "best": (best.get("trial_id"),
            best.get("score")), "lost": (result.get("summary") or {}).get("lost_worker_seconds"), "killed": killed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="xgboost")
    parser.add_argument("--data", default="breast-cancer")
    parser.add_argument("--workers", type=int, default=1, help="workers per trial-rung (--workers)")
    parser.add_argument("--cluster", type=int, default=2, help="Dask workers started")
    parser.add_argument("--max-resource", type=int, default=27)
    parser.add_argument("--kill-after", type=int, default=20, help="saved results before the kill")
    parser.add_argument("--replace-after", type=float, default=5.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-lost-worker-") as folder:
        tmp = Path(folder)
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        procs = [start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0",
                        "--no-show"], tmp / "scheduler.log")]
        try:
            time.sleep(3)
            procs += [worker(address, f"w{i + 1}", tmp) for i in range(args.cluster)]
            from distributed import Client

            with Client(address, timeout="30s") as client:
                client.wait_for_workers(args.cluster, timeout=120)
            untouched = tune(args, address, tmp, "untouched")
            print(untouched, flush=True)

            def kill(job_dir: Path, proc: subprocess.Popen) -> str | None:
                while proc.poll() is None and saved(job_dir) < args.kill_after:
                    time.sleep(0.1)
                if proc.poll() is not None:
                    return None
                victim = procs[-1]
                os.killpg(victim.pid, signal.SIGKILL)
                at = saved(job_dir)
                time.sleep(args.replace_after)
                procs.append(worker(address, f"w{args.cluster + 1}", tmp))
                return f"w{args.cluster} SIGKILLed at {at} saved results; w{args.cluster + 1} started " \
                       f"{args.replace_after:g} s later"

            killed = tune(args, address, tmp, "killed", kill)
            print(killed, flush=True)
            same = killed["best"] == untouched["best"]
            print(f"same best: {same}; wall {untouched['wall']:.1f} s untouched, {killed['wall']:.1f} s killed "
                  f"(+{killed['wall'] - untouched['wall']:.1f} s)")
            return 0 if same and killed["exit"] == 0 and killed["finished"] == killed["children"] else 1
        finally:
            for proc in reversed(procs):
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            time.sleep(2)
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


if __name__ == "__main__":
    sys.exit(main())
