"""Stalls: the default-shaped job run again and again, and where its time goes.

Runs ``hyperband tune --rounds-per-unit 1 --no-baseline --no-register-model`` (XGBoost on bank-marketing,
(r=1, R=81, η=3): 143 configs, 206 trial-rungs) end to end, as a user does, each run with its own
temporary Prefect server and a fresh MLflow sqlite store, ``--runs`` times at each concurrency.
Per run it prints:

* **flow wall**: the job's ``wall_seconds`` (the flow, from its first line to the summary);
* **trial-rung s**: the summed train + evaluate seconds of its trial-rungs;
* **longest gap**: the longest stretch, between the first training start and the last training end,
  in which no trial-rung was training anywhere (the summary's ``longest_idle_seconds``, from the
  start/end stamps of every trial-rung);
* **API p50/max**: while the job runs, the latency of the Prefect API that the UI reads
  (``POST /api/flow_runs/filter``), polled every 0.5 s: does the UI stay responsive?

and, per concurrency, the median flow wall and the largest deviation from it.

Run from the repository root::

    python benchmarks/bench_stalls.py                 # 5 runs at concurrency 1 and 2 (~5 min on 2 cores)
    python benchmarks/bench_stalls.py --runs 2 --concurrency 2
    python benchmarks/bench_stalls.py --api-url http://127.0.0.1:4200/api --tracking-uri http://127.0.0.1:5000
        # against running servers, e.g. Prefect and MLflow on PostgreSQL (docs/operations.md, 1b)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


class ApiProbe:
    """Times the UI's flow-run listing on the job's temporary server once its URL appears in the log."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            if self.url is None:
                continue
            began = time.perf_counter()
            try:
                req = urllib.request.Request(f"{self.url}/api/flow_runs/filter", data=b'{"limit": 10}',
                                             headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=30).read()
            except Exception:
                continue  # the server is starting or stopping
            self.latencies.append(time.perf_counter() - began)


def run_once(tmp: Path, concurrency: int, extra: list[str], api_url: str | None = None,
             tracking_uri: str | None = None) -> dict[str, Any]:
    job_dir = tmp / f"jobs-c{concurrency}"
    # the job as a user runs it: none of _common's in-process settings (log level, database timeout)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1",
               MLFLOW_TRACKING_URI=tracking_uri or f"sqlite:///{tmp / f'mlflow-{time.time_ns()}.db'}")
    if api_url:  # a running server (e.g. on PostgreSQL) instead of the job's temporary one
        env["PREFECT_API_URL"] = api_url
    exe = Path(sys.executable).parent / "hyperband"
    argv = [str(exe) if exe.exists() else "hyperband", "tune", "--rounds-per-unit", "1", "--concurrency", str(concurrency),
            "--no-baseline", "--no-register-model", "--json", "--job-dir", str(job_dir), *extra]
    probe = ApiProbe()
    probe.url = api_url[: -len("/api")] if api_url and api_url.endswith("/api") else api_url
    probe.thread.start()
    began = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            found = re.search(r"Starting temporary server on (http://[0-9.]+:[0-9]+)", line)
            if found:
                probe.url = found.group(1)
            if "ERROR" in line or "Error flushing" in line:
                errors.append(line.strip()[:200])

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    reader.join(timeout=10)
    probe.stop.set()
    end_to_end = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"hyperband tune exited {proc.returncode}; errors: {errors[-5:]}")
    result = json.loads(out.strip().splitlines()[-1])
    rows = json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]
    lat = sorted(probe.latencies) or [float("nan")]
    return {
        "concurrency": concurrency,
        "flow_wall": result["summary"]["wall_seconds"],
        "end_to_end": end_to_end,
        "trial_rung_s": sum(r["train_seconds"] + r["eval_seconds"] for r in rows),
        "longest_gap": result["summary"]["longest_idle_seconds"],
        "api_p50": lat[len(lat) // 2],
        "api_max": lat[-1],
        "best": result["summary"]["best_score"],
        "errors": len(errors),
        "error_lines": errors[:3],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-resource", type=int, default=81)
    parser.add_argument("--api-url", help="a running Prefect server's API (default: each job's temporary server)")
    parser.add_argument("--tracking-uri", help="an MLflow tracking server (default: a fresh sqlite store per run)")
    args = parser.parse_args(argv)
    common.header(f"bench_stalls: hyperband tune, XGBoost on bank-marketing, (1, {args.max_resource}, 3), "
                  f"--rounds-per-unit 1, {args.runs} runs per concurrency")
    results = []
    with common.workdir("stalls") as tmp:
        for c in args.concurrency:
            for i in range(args.runs):
                r = run_once(tmp, c, ["--max-resource", str(args.max_resource), "--job-id", f"c{c}-{i}-{time.time_ns()}"],
                             args.api_url, args.tracking_uri)
                results.append(r)
                print(f"   c={c} run {i + 1}: flow {r['flow_wall']:.1f} s, trial-rungs {r['trial_rung_s']:.1f} s, "
                      f"longest gap {r['longest_gap']:.2f} s, API p50 {r['api_p50'] * 1000:.0f} ms max {r['api_max'] * 1000:.0f} ms, "
                      f"{r['errors']} error lines", flush=True)
                for line in r["error_lines"]:
                    print(f"      {line}", flush=True)
    print()
    table = [(r["concurrency"], r["flow_wall"], r["end_to_end"], r["trial_rung_s"], r["longest_gap"],
              1000 * r["api_p50"], 1000 * r["api_max"], f"{r['best']:.4f}", r["errors"]) for r in results]
    print(common.table(table, ["conc.", "flow wall s", "end to end s", "trial-rung s", "longest gap s",
                               "API p50 ms", "API max ms", "best AUC", "errors"]))
    print()
    for c in args.concurrency:
        walls = [r["flow_wall"] for r in results if r["concurrency"] == c]
        median = statistics.median(walls)
        spread = max(abs(w - median) for w in walls) / median
        gaps = max(r["longest_gap"] for r in results if r["concurrency"] == c)
        print(f"concurrency {c}: median flow wall {median:.1f} s, largest deviation {100 * spread:.0f}% of it, "
              f"longest gap of all runs {gaps:.2f} s")
    print(json.dumps({"bench": "stalls", "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
