"""What a trial-rung costs on Prefect's task workers (``--task-workers``), beside this process's threads, same run.

Starts a Prefect server (SQLite, loopback) and ``--workers`` ``hyperband worker --limit L`` processes, each in a
folder of its own, then runs the same ASHA job (synthetic trials, ``--unit-seconds`` a unit, ``--configs`` configs,
R=9, eta 3) twice: on this process's threads at concurrency workers x L, and with ``--task-workers``. For each it
prints the job's wall, the training seconds (the trial-rungs' own), the overhead per trial-rung (the slots' time not
spent training, per trial-rung: (slots x wall - training) / trial-rungs) and the slots' busy fraction. With
``--pool``, the same job on a process work pool too (``--trial-pool``: a flow run and a process per trial-rung).

Run from the repository root::

    .venv/bin/python benchmarks/bench_task_workers.py                     # 200 configs, 2 s units
    .venv/bin/python benchmarks/bench_task_workers.py --configs 60 --unit-seconds 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

BIN = Path(sys.executable).parent


def _job(env: dict[str, str], cwd: Path, flags: list[str]) -> dict:
    out = subprocess.run([str(BIN / "hyperband"), "tune", *flags, "--json"], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=7200)
    if out.returncode != 0:
        raise SystemExit(f"hyperband tune failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]
    result["training"] = sum(r["train_seconds"] for r in rows)
    result["n"] = len(rows)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=2, help="slots per worker (the job's concurrency: workers x limit)")
    ap.add_argument("--worker-limit", type=int, default=0, help="hyperband worker --limit (0: what it is sent)")
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--unit-seconds", type=float, default=2.0)
    ap.add_argument("--pool", action="store_true", help="the same job on a process work pool too (slow)")
    args = ap.parse_args()
    slots = args.workers * args.limit
    common.header(f"task workers vs threads: ASHA, synthetic {args.unit_seconds:g} s units, {args.configs} configs, "
                  f"R=9, {args.workers} workers x {args.limit}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-task-workers-"))
    port = common.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp / "home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1", HYPERBAND_NO_LIVE="1")
    procs: list[subprocess.Popen] = []
    flags = ["--model", "synthetic", "--mode", "asha", "--max-trials", str(args.configs), "--max-resource", "9",
             "--unit-seconds", str(args.unit_seconds), "--seed", "0", "--no-baseline", "--no-register-model",
             "--concurrency", str(slots)]
    runs = []
    try:
        procs.append(subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                                       str(port)], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        common.wait_http(f"http://127.0.0.1:{port}/api/health", "prefect server")
        for i in range(args.workers):
            (tmp / f"machine-{i}").mkdir()
            procs.append(subprocess.Popen([str(BIN / "hyperband"), "worker", "--limit", str(args.worker_limit)], env=env,
                                          cwd=tmp / f"machine-{i}", stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        time.sleep(8)  # the workers' imports and subscriptions
        runs.append(("threads", _job(env, tmp, [*flags, "--job-dir", str(tmp / "threads"),
                                                "--tracking-uri", f"sqlite:///{tmp}/threads.db"])))
        runs.append(("task workers", _job(env, tmp, [*flags, "--task-workers", "--job-dir", str(tmp / "workers"),
                                                     "--tracking-uri", f"sqlite:///{tmp}/workers.db"])))
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
                                                      str(tmp / "shared"), "--tracking-uri", f"sqlite:///{tmp}/pool.db"])))
    finally:
        common.stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for name, r in runs:
        wall = r["summary"]["wall_seconds"]
        rows.append((name, r["n"], wall, r["training"], (slots * wall - r["training"]) / r["n"],
                     r["training"] / (slots * wall), (r.get("best") or {}).get("score")))
    print(common.table(rows, ["where", "trial-rungs", "wall s", "training s", "overhead s per trial-rung",
                              "slots busy", "best"]))
    print(json.dumps({"bench": "task_workers", "slots": slots, "runs": [
        {"where": n, "trial_rungs": t, "wall": w, "training": tr, "overhead": o, "busy": b, "best": s}
        for n, t, w, tr, o, b, s in rows]}))


if __name__ == "__main__":
    main()
