"""Benchmark: many jobs at once on one Prefect server and one MLflow server, both on PostgreSQL.

Run from the repository root (as root, or as a user who may run Debian's ``postgresql`` binaries)::

    python benchmarks/bench_load.py                  # 1, 5, 10 and 20 jobs at once
    python benchmarks/bench_load.py --jobs 1 5       # some of them
    python benchmarks/bench_load.py --jobs 1 20 --asha 80   # ASHA jobs, whose end closes tens of runs at once

Starts PostgreSQL (``initdb`` in a scratch folder, 127.0.0.1, its default ``max_connections`` of 100), a
``prefect server`` and an ``mlflow server`` on it (with ``MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=40``, as
docs/operations.md starts it; ``--mlflow-max-overflow 0`` for MLflow's own pool, which 20 jobs exhaust), then for each size N runs N synthetic jobs at once, each
``hyperband tune --model synthetic --max-resource 27 --eta 3 --unit-seconds 0.05 --concurrency 2`` in its own
process and experiment (49 configs, 69 trial-rungs each). While they run, a probe every 0.5 s times one Prefect
API call (``POST /api/flow_runs/filter``), one MLflow call (``runs/search`` of an experiment) and reads
PostgreSQL's connections in use (``pg_stat_activity``). Printed per size:

* jobs per minute (N over the wall time from the first start to the last exit) and the mean job's wall time,
  beside the one-job size's (the baseline measured in the same run);
* the Prefect API's and MLflow's p50 and p99 latency under the load;
* the task-run record lag: seconds from the last job's exit until the Prefect server has recorded every task
  run of the size's jobs (Prefect records task runs from events, in the background);
* PostgreSQL's connections in use at the peak, against its 100; the runs left RUNNING after the jobs ended (none
  should be: a job's end closes every run it made).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import free_port, header, table, wait_http  # noqa: E402

BIN = Path(sys.executable).parent


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
    return json.loads(text) if text else {}


class Servers:
    """PostgreSQL, a Prefect server and an MLflow server on it, in a scratch folder; stopped on exit."""

    def __init__(self, tmp: Path, mlflow_max_overflow: int = 0) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise SystemExit("PostgreSQL is not installed: apt-get install postgresql")
        self.pg_bin, self.tmp = Path(found[-1]).parent, tmp
        self.pg, self.prefect, self.mlflow = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.mlflow_max_overflow = mlflow_max_overflow  # 0: MLflow's own (SQLAlchemy's 10)
        self.data: Path | None = None  # PostgreSQL's folder, once made
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        self.env.update(PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}", PREFECT_HOME=str(tmp / "prefect-home"),
                        PREFECT_API_URL=f"http://127.0.0.1:{self.prefect}/api", PREFECT_SERVER_ANALYTICS_ENABLED="false",
                        PREFECT_API_DATABASE_CONNECTION_URL=f"postgresql+asyncpg://hyperband@127.0.0.1:{self.pg}/prefect")

    def _start(self, name: str, argv: list[str], cwd: Path | None = None, **extra: str) -> None:
        with open(self.tmp / f"{name}.log", "ab") as log:
            self.procs.append(subprocess.Popen(argv, cwd=cwd or self.tmp, env={**self.env, **extra}, stdout=log, stderr=log,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def __enter__(self) -> Servers:
        try:
            return self._up()
        except BaseException:  # one that did not start: those that did are stopped, not left running
            for log in sorted(self.tmp.glob("*.log")):  # what each said last (the scratch folder goes with them)
                print(f"--- {log.name}:", *log.read_text(errors="replace").splitlines()[-5:], sep="\n", file=sys.stderr)
            self.__exit__()
            raise

    def _up(self) -> Servers:
        data = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        self.data = data
        if os.geteuid() == 0:
            shutil.chown(data, "postgres", "postgres")
        subprocess.run(_as_postgres([str(self.pg_bin / "initdb"), "-D", str(data), "-U", "hyperband", "--auth=trust",
                                     "--no-instructions"]), cwd=data, check=True, capture_output=True)
        self._start("postgres", _as_postgres([str(self.pg_bin / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                                              "-p", str(self.pg), "-k", str(data)]), cwd=data)
        for _ in range(120):
            if subprocess.run([str(self.pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg)],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        for db in ("prefect", "mlflow"):
            subprocess.run([str(self.pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg), "-U", "hyperband", db],
                           check=True, capture_output=True)
        self._start("prefect", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.prefect)])
        self._start("mlflow", [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.mlflow),
                               "--workers", "1", "--backend-store-uri",
                               f"postgresql://hyperband@127.0.0.1:{self.pg}/mlflow",
                               "--artifacts-destination", str(self.tmp / "mlartifacts")],
                    **({"MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": str(self.mlflow_max_overflow)}
                       if self.mlflow_max_overflow else {}))
        wait_http(f"http://127.0.0.1:{self.prefect}/api/health", "prefect server", timeout=180)
        wait_http(f"http://127.0.0.1:{self.mlflow}/health", "mlflow server", timeout=180)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM if proc is not self.procs[0] else signal.SIGINT)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)

    def connections(self) -> int:
        out = subprocess.run([str(self.pg_bin.parent / "bin" / "psql"), "-h", "127.0.0.1", "-p", str(self.pg), "-U",
                              "hyperband", "-d", "postgres", "-tAc",
                              "select count(*) from pg_stat_activity where backend_type = 'client backend'"],
                             capture_output=True, text=True)
        return int(out.stdout.strip() or 0)

    def task_runs(self) -> int:
        return int(_http("POST", f"http://127.0.0.1:{self.prefect}/api/task_runs/count", {}))  # type: ignore[arg-type]


class Probe(threading.Thread):
    """Every 0.5 s: one Prefect API call and one MLflow call timed, PostgreSQL's connections counted."""

    def __init__(self, servers: Servers) -> None:
        super().__init__(daemon=True)
        self.servers = servers
        self.prefect: list[float] = []
        self.mlflow: list[float] = []
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        s, api = self.servers, f"http://127.0.0.1:{self.servers.mlflow}/api/2.0/mlflow"
        while not self.done.wait(0.5):
            began = time.perf_counter()
            try:
                _http("POST", f"http://127.0.0.1:{s.prefect}/api/flow_runs/filter", {"limit": 5})
                self.prefect.append(time.perf_counter() - began)
            except OSError:
                pass
            began = time.perf_counter()
            try:
                _http("POST", f"{api}/runs/search", {"experiment_ids": ["0"], "max_results": 50})
                self.mlflow.append(time.perf_counter() - began)
            except OSError:
                pass
            self.peak = max(self.peak, s.connections())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def open_runs(servers: Servers, experiment: str) -> int:
    """Runs of ``experiment`` left RUNNING on the MLflow server (a job's end closes every one)."""
    api = f"http://127.0.0.1:{servers.mlflow}/api/2.0/mlflow"
    found = _http("GET", f"{api}/experiments/get-by-name?experiment_name={experiment}", timeout=60)
    body = {"experiment_ids": [found["experiment"]["experiment_id"]], "filter": "attributes.status = 'RUNNING'",
            "max_results": 1000}
    return len(_http("POST", f"{api}/runs/search", body, timeout=60).get("runs", []))


def _trial_rungs(out: Path) -> int:
    """The job's trial-rungs, from its summary (``--json``'s last line); 0 when it printed none."""
    try:
        return int(json.loads(out.read_text().strip().splitlines()[-1])["summary"]["trial_rungs"])
    except (ValueError, KeyError, IndexError):
        return 0


def run_size(servers: Servers, n: int, tmp: Path, tag: str, asha: int | None = None) -> dict[str, float]:
    before = servers.task_runs()
    probe = Probe(servers)
    probe.start()
    began = time.perf_counter()
    procs = []
    for i in range(n):
        argv = [str(BIN / "hyperband"), "tune", "--model", "synthetic", "--max-resource", "27", "--eta", "3",
                "--unit-seconds", "0.05", "--concurrency", "2", "--experiment", f"{tag}-{i}", "--job-id", f"{tag}-{i}",
                "--tracking-uri", f"http://127.0.0.1:{servers.mlflow}", "--job-dir", str(tmp / "jobs"), "--json"]
        if asha:  # ASHA's end stops every trial still waiting in a rung: a job ends tens of runs at once
            argv += ["--mode", "asha", "--max-trials", str(asha)]
        out = open(tmp / f"{tag}-{i}.out", "wb")
        procs.append((subprocess.Popen(argv, env=servers.env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL), out, time.perf_counter()))
    walls, failed = [], 0
    for proc, out, started in procs:
        code = proc.wait()
        out.close()
        walls.append(time.perf_counter() - started)
        failed += code != 0
    wall = time.perf_counter() - began
    ended = time.perf_counter()
    expected = before + 2 * sum(_trial_rungs(tmp / f"{tag}-{i}.out") for i in range(n))  # a train and an evaluate each
    lag, missing = float("nan"), 0
    while time.perf_counter() - ended < 300:
        missing = expected - servers.task_runs()
        if missing <= 0:
            lag = time.perf_counter() - ended
            break
        time.sleep(0.5)
    probe.done.set()
    probe.join()
    said = [line for i in range(n) for line in (tmp / f"{tag}-{i}.out").read_text(errors="replace").splitlines()
            if "event stream" in line or "EventsWorker" in line or "task runs of that moment" in line]
    if said:  # where the missing task runs went, as the jobs said it
        print(f"  {len(said)} lines of {n} jobs on Prefect's events, e.g.: {said[0][:300]}", flush=True)
    dropped = (tmp / "prefect.log").read_text(errors="replace").count("Subscription queue is full")
    if dropped:  # the server's in-memory broker: a subscriber's queue holds 10,000 messages, then drops (cumulative)
        print(f"  the Prefect server dropped {dropped} event messages so far (its in-memory broker's "
              "\"Subscription queue is full\")", flush=True)
    return {"jobs": n, "failed": failed, "wall": wall, "per_minute": n / wall * 60, "mean_job": statistics.mean(walls),
            "prefect_p50": _pct(probe.prefect, 0.5), "prefect_p99": _pct(probe.prefect, 0.99),
            "mlflow_p50": _pct(probe.mlflow, 0.5), "mlflow_p99": _pct(probe.mlflow, 0.99), "lag": lag,
            "missing": max(0, missing), "expected": expected - before,
            "connections": probe.peak, "open_runs": sum(open_runs(servers, f"{tag}-{i}") for i in range(n))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 5, 10, 20], help="sizes: jobs at once")
    parser.add_argument("--asha", type=int, metavar="N", help="ASHA jobs of N configs each (default: Hyperband's 49)")
    parser.add_argument("--mlflow-max-overflow", type=int, default=40, metavar="N",
                        help="the MLflow server's MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW, as docs/operations.md sets it "
                             "(0: MLflow's own, 10, whose pool 20 jobs exhaust)")
    args = parser.parse_args(argv)
    header("bench_load: jobs at once on one Prefect server and one MLflow server on PostgreSQL")
    jobs = f"ASHA jobs of {args.asha} configs" if args.asha else "Hyperband (1, 27, 3) jobs"
    print(f"  {jobs}; the MLflow server's "
          f"MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW: {args.mlflow_max_overflow or 'its default, 10'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch, \
            Servers(Path(scratch), args.mlflow_max_overflow) as servers:
        for n in args.jobs:
            rows.append(run_size(servers, n, Path(scratch), f"n{n}", args.asha))
            print(f"  {n} jobs: {rows[-1]['wall']:.1f} s, {rows[-1]['failed']} failed", flush=True)
    base = rows[0]["mean_job"]
    print(table(
        [[r["jobs"], r["failed"], f"{r['per_minute']:.1f}", f"{r['mean_job']:.1f}", f"{r['mean_job'] / base:.2f}x",
          f"{r['prefect_p50']:.3f}/{r['prefect_p99']:.3f}", f"{r['mlflow_p50']:.3f}/{r['mlflow_p99']:.3f}",
          f"{r['lag']:.1f}" if r["lag"] == r["lag"] else f"{r['missing']} of {r['expected']} missing at 300 s",
          r["connections"], r["open_runs"]] for r in rows],
        ["jobs", "failed", "jobs/min", "mean job s", f"vs {rows[0]['jobs']} job", "Prefect p50/p99 s",
         "MLflow p50/p99 s", "task-run lag s", "PG conns (of 100)", "runs left RUNNING"]))
    return 1 if any(r["failed"] or r["open_runs"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
