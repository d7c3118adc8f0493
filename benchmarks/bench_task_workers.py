"""What a trial-rung costs on Prefect's task workers (``--task-workers``), beside this process's threads, same run.

Starts a Prefect server (SQLite, loopback; this project's application with batched writes, as docs/operations.md
starts one on SQLite) and ``--workers`` ``hyperband worker --limit L`` processes, each in a
folder of its own, then runs the same ASHA job (synthetic trials, ``--unit-seconds`` a unit, ``--configs`` configs,
R=9, eta 3) twice: on this process's threads at concurrency workers x L, and with ``--task-workers``. For each it
prints the job's wall, the training seconds (the trial-rungs' own), the overhead per trial-rung (the slots' time not
spent training, per trial-rung: (slots x wall - training) / trial-rungs), the slots' busy fraction, and the CPU
seconds per trial-rung that the Prefect server, the workers and the job's process spent (where a 2-core machine's
overhead goes: the synthetic trials sleep). With ``--pool``, the same job on a process work pool too (``--trial-pool``:
a flow run and a process per trial-rung); ``--where task-workers`` runs that job alone. With ``--kill-after S``, the
workers and the job share ``--storage`` and the first worker is SIGKILLed S seconds into the task-workers job, a
replacement started ``--replace-after`` seconds later (issue 78: the kill's cost is the overhead's difference).

Run from the repository root::

    .venv/bin/python benchmarks/bench_task_workers.py                     # 200 configs, 2 s units
    .venv/bin/python benchmarks/bench_task_workers.py --configs 60 --unit-seconds 1
    .venv/bin/python benchmarks/bench_task_workers.py --mode hyperband --max-resource 27 --unit-seconds 0.2 \
        --worker-limit 2 --kill-after 25                                   # a worker killed mid-job
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

from prefect_hyperband.flows.server import BATCHED_WRITES, OUR_APP  # noqa: E402

BIN = Path(sys.executable).parent


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes and their children spent so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            tree = [psutil.Process(pid)]
            tree += tree[0].children(recursive=True)
        except psutil.Error:  # gone, or its children changed while read
            continue
        for one in tree:
            try:
                t = one.cpu_times()
            except psutil.Error:  # a child that ended while read: the others still count
                continue
            total += t.user + t.system
    return total


def _job(env: dict[str, str], cwd: Path, flags: list[str], server: int = 0, workers: list[int] = ()) -> dict:
    before = (_cpu([server]), _cpu(list(workers)))
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen([str(BIN / "hyperband"), "tune", *flags, "--json"], cwd=cwd, env=env, stdout=stdout,
                                stderr=stderr, text=True)
        job_cpu = 0.0
        while proc.poll() is None:  # the job's own CPU, read while it lives (a child's times are gone once reaped)
            job_cpu = max(job_cpu, _cpu([proc.pid]))
            time.sleep(0.5)
        stdout.seek(0)
        stderr.seek(0)
        out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout.read(), stderr.read())
    if out.returncode != 0:
        raise SystemExit(f"hyperband tune failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]
    result["training"] = sum(r["train_seconds"] for r in rows)
    result["n"] = len(rows)
    result["cpu"] = (_cpu([server]) - before[0], _cpu(list(workers)) - before[1], job_cpu)
    return result


def _worker(env: dict[str, str], cwd: Path, limit: int, shared: list[str]) -> subprocess.Popen:
    cwd.mkdir(exist_ok=True)
    return subprocess.Popen([str(BIN / "hyperband"), "worker", "--limit", str(limit), *shared], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _killer(procs: list[subprocess.Popen], env: dict[str, str], tmp: Path, args: argparse.Namespace,
            shared: list[str]) -> threading.Thread:
    """SIGKILLs the first worker ``args.kill_after`` seconds from now, and starts a replacement ``args.replace_after``
    seconds later (appended to ``procs``, stopped with them)."""
    def kill() -> None:
        time.sleep(args.kill_after)
        os.killpg(procs[1].pid, signal.SIGKILL)
        print(f"killed worker {procs[1].pid} at {args.kill_after:g} s", flush=True)
        time.sleep(args.replace_after)
        procs.append(_worker(env, tmp / "machine-replacement", args.worker_limit, shared))

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=2, help="slots per worker (the job's concurrency: workers x limit)")
    ap.add_argument("--worker-limit", type=int, default=0, help="hyperband worker --limit (0: what it is sent)")
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--unit-seconds", type=float, default=2.0)
    ap.add_argument("--pool", action="store_true", help="the same job on a process work pool too (slow)")
    ap.add_argument("--where", default="threads,task-workers", help="which of threads,task-workers to run")
    ap.add_argument("--mode", default="asha", choices=["asha", "hyperband"])
    ap.add_argument("--max-resource", type=int, default=9)
    ap.add_argument("--kill-after", type=float, default=0.0, help="SIGKILL the first worker this many seconds into "
                    "the task-workers job (0: no kill); the workers and the job then share --storage")
    ap.add_argument("--replace-after", type=float, default=5.0, help="seconds after the kill a replacement starts")
    args = ap.parse_args()
    slots = args.workers * args.limit
    common.header(f"task workers vs threads: {args.mode}, synthetic {args.unit_seconds:g} s units, "
                  f"{args.configs if args.mode == 'asha' else 'all'} configs, R={args.max_resource}, {args.workers} "
                  f"workers x {args.limit}{f', one killed at {args.kill_after:g} s' if args.kill_after else ''}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-task-workers-"))
    port = common.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp / "home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1", HYPERBAND_NO_LIVE="1")
    procs: list[subprocess.Popen] = []
    flags = ["--model", "synthetic", "--mode", args.mode, "--max-resource", str(args.max_resource), "--eta", "3",
             "--unit-seconds", str(args.unit_seconds), "--seed", "0", "--no-baseline", "--no-register-model",
             "--concurrency", str(slots), *(["--max-trials", str(args.configs)] if args.mode == "asha" else [])]
    shared = ["--storage", str(tmp / "shared")] if args.kill_after else []
    runs = []
    try:
        # the server as docs/operations.md starts one for task workers on SQLite: its event consumers' writes batched,
        # and this project's application (new task runs begun IMMEDIATE: not refused with a 503 and a 2 s retry)
        procs.append(subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", OUR_APP, "--host", "127.0.0.1",
                                       "--port", str(port)], env={**env, **BATCHED_WRITES}, cwd=tmp,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        common.wait_http(f"http://127.0.0.1:{port}/api/health", "prefect server")
        for i in range(args.workers):
            (tmp / f"machine-{i}").mkdir()
            procs.append(_worker(env, tmp / f"machine-{i}", args.worker_limit, shared))
        time.sleep(8)  # the workers' imports and subscriptions
        server, workers = procs[0].pid, [p.pid for p in procs[1:]]
        if "threads" in args.where:
            runs.append(("threads", _job(env, tmp, [*flags, "--job-dir", str(tmp / "threads"),
                                                    "--tracking-uri", f"sqlite:///{tmp}/threads.db"], server, workers)))
        if "task-workers" in args.where:
            killer = _killer(procs, env, tmp, args, shared) if args.kill_after else None
            runs.append(("task workers" + (" (one killed)" if killer else ""), _job(
                env, tmp, [*flags, *shared, "--task-workers", "--job-dir", str(tmp / "workers"), "--tracking-uri",
                           f"sqlite:///{tmp}/workers.db"], server, workers)))
        if args.pool:
            subprocess.run([str(BIN / "prefect"), "work-pool", "create", "bench-pool", "--type", "process"], env=env,
                           check=True, capture_output=True)
            for i in range(args.workers):
                procs.append(subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "bench-pool",
                                               "--limit", str(args.limit)], env=env, cwd=tmp / f"machine-{i}",
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
            time.sleep(5)
            runs.append(("work pool", _job(env, tmp, [*flags, "--trial-pool", "bench-pool", "--storage",
                                                      str(tmp / "shared"), "--tracking-uri", f"sqlite:///{tmp}/pool.db"],
                                                 server)))
    finally:
        common.stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for name, r in runs:
        wall = r["summary"]["wall_seconds"]
        cpu = [c / r["n"] for c in r["cpu"]]
        rows.append((name, r["n"], wall, r["training"], (slots * wall - r["training"]) / r["n"],
                     r["training"] / (slots * wall), *cpu, (r.get("best") or {}).get("score")))
    print(common.table(rows, ["where", "trial-rungs", "wall s", "training s", "overhead s per trial-rung",
                              "slots busy", "server CPU s/tr", "workers CPU s/tr", "job CPU s/tr", "best"]))
    print(json.dumps({"bench": "task_workers", "slots": slots, "runs": [
        {"where": n, "trial_rungs": t, "wall": w, "training": tr, "overhead": o, "busy": b, "cpu_server": cs,
         "cpu_workers": cw, "cpu_job": cj, "best": s}
        for n, t, w, tr, o, b, cs, cw, cj, s in rows]}))


if __name__ == "__main__":
    main()
