"""What a Prefect work pool costs per trial-rung: the same job in one process and on a pool, same run.

Starts a Prefect server (SQLite, loopback), a process work pool and ``--workers`` process workers
(``PREFECT_WORKER_QUERY_SECONDS=1``), then runs ``hyperband tune`` twice with the same flags and seed:
in one process, and with ``--trial-pool`` and a shared ``--storage`` folder. Prints both walls (the
CLI's, end to end), the seconds per trial-rung, the ratio, and checks that both jobs found the same
best trial and score. On one machine every worker shares its cores, so this measures the pool's
overhead (a flow run and a process per trial-rung), not a speed-up.

Run from the repository root::

    python benchmarks/bench_trial_pool.py                      # XGBoost (1, 9, 3) on breast-cancer
    python benchmarks/bench_trial_pool.py --max-resource 27 --data bank-marketing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

BIN = Path(sys.executable).parent


def _tune(env: dict[str, str], cwd: Path, flags: list[str]) -> tuple[dict, float]:
    began = time.perf_counter()
    out = subprocess.run([str(BIN / "hyperband"), "tune", *flags, "--json"], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=1800)
    wall = time.perf_counter() - began
    if out.returncode != 0:
        raise SystemExit(f"hyperband tune failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), wall


@contextlib.contextmanager
def work_pool(tmp: Path, workers: int) -> Iterator[dict[str, str]]:
    """A Prefect server of its own (SQLite in ``tmp``, loopback), a process work pool ``bench-pool`` and ``workers``
    process workers, each in its own folder (a machine); yields the environment of a CLI that uses them."""
    port = common.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp / "home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1", HYPERBAND_NO_LIVE="1")
    procs = []
    try:
        procs.append(subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                      env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        common.wait_http(f"http://127.0.0.1:{port}/api/health", "prefect server")
        subprocess.run([str(BIN / "prefect"), "work-pool", "create", "bench-pool", "--type", "process"], env=env,
                       check=True, capture_output=True)
        for i in range(workers):
            (tmp / f"machine-{i}").mkdir()
            procs.append(subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "bench-pool"], env=env,
                                          cwd=tmp / f"machine-{i}", stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        time.sleep(5)  # the workers' first poll
        yield env
    finally:
        common.stop_all(procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="process workers on the pool")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--max-resource", type=int, default=9)
    ap.add_argument("--data", default="breast-cancer")
    args = ap.parse_args()
    common.header(f"trial pool vs one process: xgboost (1, {args.max_resource}, 3) on {args.data}, "
                  f"{args.workers} workers, concurrency {args.concurrency}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    try:
        with work_pool(tmp, args.workers) as env:
            flags = ["--model", "xgboost", "--data", args.data, "--max-resource", str(args.max_resource), "--seed",
                     "0", "--rounds-per-unit", "2", "--no-baseline", "--no-register-model", "--concurrency",
                     str(args.concurrency)]
            local, local_wall = _tune(env, tmp, [*flags, "--job-dir", str(tmp / "local"),
                                                 "--tracking-uri", f"sqlite:///{tmp}/local.db"])
            pooled, pool_wall = _tune(env, tmp, [*flags, "--trial-pool", "bench-pool", "--storage",
                                                 str(tmp / "shared"), "--tracking-uri", f"sqlite:///{tmp}/pool.db"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = local["summary"]["trial_rungs"]
    rows = [("one process", local_wall, local["summary"]["wall_seconds"], local_wall / n, 1.0),
            (f"pool, {args.workers} workers", pool_wall, pooled["summary"]["wall_seconds"], pool_wall / n,
             pool_wall / local_wall)]
    print(common.table(rows, ["run", "wall s (CLI)", "flow s", "s per trial-rung", "x one process"]))
    same = (local["best"]["trial_id"], local["summary"]["best_score"]) == (pooled["best"]["trial_id"], pooled["summary"]["best_score"])
    print(f"{n} trial-rungs; same best trial and score: {same} ({pooled['summary']['best_score']:.6f})")
    print(json.dumps({"bench": "trial_pool", "local_wall": local_wall, "pool_wall": pool_wall,
                      "ratio": pool_wall / local_wall, "same_best": same}))


if __name__ == "__main__":
    main()
