"""Benchmark: does a result cost the same at the 10,000th trial-rung as at the 10th?

Run from the repository root::

    python benchmarks/bench_job_size.py                 # 1,000, 3,000 and 10,000 trial-rungs
    python benchmarks/bench_job_size.py --quick         # 300, 600 and 1,500

Each job is what a new user types, ``hyperband tune --model synthetic --mode asha --max-resource 9
--concurrency 8 --max-trials N`` (instant synthetic trials, its own temporary Prefect server, MLflow in a
fresh ``sqlite:///mlflow.db``), run as a child process. Printed, from the job's own files and the process:

* results per second, per thousand trial-rungs in the order they ended (the rows' ``ended`` times), and the
  last thousand's rate over the first's (target: at least 0.8x; at least 40 results/s sustained);
* the controller's peak resident memory (the ``hyperband`` process, sampled every 0.2 s; the Prefect server
  it starts is a process of its own and not counted), at the small and at the large job;
* bytes written to the job's state per result (``state.json``'s ``writes``: every snapshot and journal record
  the job wrote), at each size (target: flat). A snapshot folds the journal in once the journal is as large as the
  snapshot (256 KiB at least), so the first thousand results may end before the first fold: the middle size
  shows where the cost settles.

ASHA with R=9 and eta=3 runs about 1.34 trial-rungs per config, so ``--max-trials`` is the trial-rungs wanted
divided by that.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import header, table  # noqa: E402

RUNGS_PER_CONFIG = 1.345  # ASHA, r=1, R=9, eta=3, measured: 4,027 trial-rungs of 3,000 configs


def run_job(trial_rungs: int, concurrency: int, where: Path) -> dict:
    """One job as a child process; its rows, the state's write counters and the peak RSS of the process."""
    import psutil

    configs = max(1, round(trial_rungs / RUNGS_PER_CONFIG))
    job_dir = where / "jobs"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HYPERBAND_NO_LIVE": "1"}
    env.pop("PREFECT_API_URL", None)  # its own temporary server, as a new user's job
    cmd = [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--mode", "asha",
           "--max-resource", "9", "--concurrency", str(concurrency), "--max-trials", str(configs), "--no-baseline",
           "--job-dir", str(job_dir), "--job-id", "big", "--json"]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, me.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"the job of {trial_rungs} trial-rungs failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    state = json.loads((job_dir / "big" / "state.json").read_text())
    return {"rows": state["rows"], "writes": state["writes"], "peak": peak, "wall": wall,
            "flow": result["summary"]["wall_seconds"]}


def per_thousand(rows: list[dict], size: int = 1000) -> list[float]:
    """Results per second in each block of ``size`` trial-rungs, in the order they ended."""
    ends = sorted(r["ended"] for r in rows if r.get("ended"))
    rates = []
    for i in range(0, len(ends) - size + 1, size):
        block = ends[i:i + size]
        rates.append((size - 1) / max(block[-1] - block[0], 1e-9))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 and 1,500 trial-rungs, blocks of 300")
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    small, middle, large, block = (300, 600, 1500, 300) if args.quick else (1000, 3000, 10_000, 1000)
    header(f"job size: ASHA, synthetic instant trials, --concurrency {args.concurrency}")
    with tempfile.TemporaryDirectory(prefix="bench-size-") as tmp:
        jobs = {}
        for n in (small, middle, large):
            where = Path(tmp) / str(n)
            where.mkdir()
            jobs[n] = run_job(n, args.concurrency, where)
            print(f"{len(jobs[n]['rows']):,} trial-rungs: flow {jobs[n]['flow']:.1f} s, end to end {jobs[n]['wall']:.1f} s",
                  flush=True)
    rates = per_thousand(jobs[large]["rows"], block)
    print()
    print(table([[f"{i * block + 1:,}-{(i + 1) * block:,}", f"{r:.1f}"] for i, r in enumerate(rates)],
                ["trial-rungs", "results/s"]))
    print()
    rows = []
    for n in (small, middle, large):
        j = jobs[n]
        done = len(j["rows"])
        rows.append([f"{done:,}", f"{done / j['flow']:.1f}", f"{j['peak'] / 2**20:.0f}",
                     f"{j['writes']['bytes'] / done:,.0f}", j["writes"]["snapshots"], j["writes"]["records"]])
    print(table(rows, ["trial-rungs", "results/s (flow)", "peak RSS MiB", "state bytes/result", "snapshots",
                       "journal records"]))
    last_first = rates[-1] / rates[0] if rates else float("nan")
    sustained = len(jobs[large]["rows"]) / jobs[large]["flow"]
    flat = (jobs[large]["writes"]["bytes"] / len(jobs[large]["rows"])) / (jobs[small]["writes"]["bytes"] / len(jobs[small]["rows"]))
    print()
    print(f"last block / first block: {last_first:.2f}x (target >= 0.8x): {'met' if last_first >= 0.8 else 'missed'}")
    print(f"sustained: {sustained:.1f} results/s (target >= 40): {'met' if sustained >= 40 else 'missed'}")
    settled = (jobs[large]["writes"]["bytes"] / len(jobs[large]["rows"])) / (jobs[middle]["writes"]["bytes"] / len(jobs[middle]["rows"]))
    print(f"state bytes per result, large / small: {flat:.2f}x, large / middle: {settled:.2f}x (target: flat)")
    print(f"controller peak RSS, large / small: {jobs[large]['peak'] / jobs[small]['peak']:.2f}x")


if __name__ == "__main__":
    main()
