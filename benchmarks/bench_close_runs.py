"""Ending the trials' MLflow runs against a tracking server: one at a time (the baseline) vs ``CLOSE_THREADS`` at once.

A job's end (and ASHA's ``finish``, which stops every trial still waiting in a rung) ends thousands of child runs:
each a tags write and an end write (``tasks.records.close_trial_runs``). Against an ``mlflow server`` on loopback
(its store SQLite or ``--backend-store-uri postgresql://...``, its default 4 workers or ``--workers``), this creates
``--runs`` runs under one parent twice and ends each set, once with one thread and once with ``CLOSE_THREADS``,
and prints the seconds and the ratio. Run from the repository root::

    python benchmarks/bench_close_runs.py --runs 400
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--backend-store-uri", default=None, help="default: an SQLite file in a temporary folder")
    ap.add_argument("--workers", type=int, default=4, help="the mlflow server's worker processes (its default: 4)")
    args = ap.parse_args()
    from mlflow import MlflowClient

    from prefect_hyperband.hyperband.scheduler import TrialRecord
    from prefect_hyperband.tracking import records

    common.header(f"ending {args.runs} trial runs against an mlflow server: 1 thread vs {records.CLOSE_THREADS}")
    with tempfile.TemporaryDirectory(prefix="bench-close-") as tmp:
        port = common.free_port()
        store = args.backend_store_uri or f"sqlite:///{tmp}/mlflow.db"
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                                   "--workers", str(args.workers), "--backend-store-uri", store,
                                   "--artifacts-destination", f"{tmp}/artifacts"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            common.wait_http(f"{url}/health", "the mlflow server")
            client = MlflowClient(url)
            experiment = client.create_experiment(f"close-runs-{time.time_ns()}")
            warm = {f"w{i}": client.create_run(experiment).info.run_id for i in range(40)}  # every server worker up
            records.close_trial_runs(SimpleNamespace(tracking_uri=url),
                                    [TrialRecord(t, 0, {}, "stopped", 0, 1, {1: 0.5}) for t in warm], warm)
            rows = []
            for threads in (1, records.CLOSE_THREADS):
                parent = client.create_run(experiment).info.run_id
                runs = {f"s0-{i:04d}": client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
                        for i in range(args.runs)}
                trials = [TrialRecord(t, 0, {}, "stopped", 0, 1, {1: 0.5}) for t in runs]
                records.CLOSE_THREADS = threads
                began = time.perf_counter()
                records.close_trial_runs(SimpleNamespace(tracking_uri=url), trials, runs)
                rows.append([threads, args.runs, time.perf_counter() - began])
            ended = [r for r in client.search_runs([experiment], max_results=5000) if r.info.status == "FINISHED"]
            assert len(ended) == 2 * args.runs + len(warm), len(ended)
        finally:
            server.terminate()
            server.wait(timeout=30)
    base = rows[0][2]
    print(common.table([[t, n, f"{s:.2f}", f"{n / s:.0f}", f"{base / s:.2f}x"] for t, n, s in rows],
                       ["threads", "runs", "seconds", "runs/s", "speed-up"]))


if __name__ == "__main__":
    main()
