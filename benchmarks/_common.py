"""Shared helpers for the benchmarks: environment, a temporary Prefect server, tables, statistics.

Not a benchmark itself. Every benchmark measures its own baseline in the same process run,
so the ratios it prints hold even on a busy or noisy machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/bench_x.py` from the repo root
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
# The temporary Prefect server keeps its state in SQLite; on a loaded 2-core machine writes can
# hit SQLITE_BUSY, which the server answers with 503: wait longer and let the client retry more.
os.environ.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "60")
os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")

from prefect_hyperband.flows.server import batch_server_writes  # noqa: E402

batch_server_writes()  # the temporary server's event consumers write in batches, as the CLI's does


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a server a benchmark starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, what: str = "the server", timeout: float = 120) -> None:
    """Until ``url`` answers; past ``timeout`` seconds the benchmark ends naming ``what``."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{what} did not answer at {url} within {timeout:.0f} s")


def quiet() -> None:
    """Keep the benchmark's own table readable: Prefect/MLflow chatter to warnings only."""
    for name in ("prefect", "mlflow", "alembic", "distributed", "httpx", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def prefect_server() -> Iterator[None]:
    """A temporary Prefect API for in-process flow runs (what the test suite uses), running the app the CLI's
    temporary server runs."""
    sys.path.insert(0, str(ROOT / "tests"))
    from harness import harness  # tests/harness.py (the suite's)

    with harness(startup_timeout=180):
        quiet()
        yield


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A scratch folder (job dirs, MLflow sqlite stores), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{prefix}-") as tmp:
        yield Path(tmp)


def run_tune(attempts: int = 2, **fields: Any) -> tuple[dict[str, Any], float]:
    """Run the real ``tune`` flow in-process; (result, wall seconds measured around the call).

    A run that fails (e.g. the temporary server answering 503 under load) is run again from
    scratch under a new job id, up to ``attempts`` times; only the successful run is timed.
    """
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    job_id = fields.get("job_id")
    for attempt in range(1, attempts + 1):
        if job_id and attempt > 1:  # a fresh folder: the failed run's state must not be resumed
            fields = {**fields, "job_id": f"{job_id}-retry{attempt - 1}"}
        TuneParams(**fields)  # a bad field raises here, not as a failed flow run
        began = time.perf_counter()
        state = tune(**fields, return_state=True)
        wall = time.perf_counter() - began
        if state.is_completed():
            return state.result(), wall
        print(f"   WARNING: tune failed (attempt {attempt}/{attempts}): {str(state.message)[:300]}", flush=True)
    raise RuntimeError(f"tune failed {attempts} times: {state.message}")


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its children so far: the temporary Prefect server is one."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            pass
    return total


def machine() -> str:
    return f"{platform.node() or 'host'}: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform(terse=True)}"


def header(title: str) -> None:
    print(f"\n== {title} ==")
    print(f"   {time.strftime('%Y-%m-%d %H:%M')}  {machine()}")


def table(rows: Sequence[Sequence[Any]], head: Sequence[str]) -> str:
    cells = [list(map(str, head))] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def mean_sd(values: Sequence[float], digits: int = 4) -> str:
    if not values:
        return "n/a"
    m = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def stop_all(procs) -> None:
    """Each process's group SIGTERMed (last started first), then waited for; SIGKILLed past 20 s."""
    import signal
    import subprocess

    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
