"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` processes on loopback addresses, each
address a "host" as Dask and a rendezvous see it (every address in 127.0.0.0/8 is this machine)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from ports import free_port  # tests/ports.py


class Cluster:
    def __init__(self, hosts: list[str], log_dir: str) -> None:
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "OMP_NUM_THREADS": "1"}
        self.scheduler = self._start(["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--dashboard-address", ":0", "--no-show"], "scheduler", env)
        self.env = env
        self.workers: list[subprocess.Popen] = []
        for host in hosts:
            self.add(host)
        self.wait_for(len(hosts))

    def add(self, host: str) -> subprocess.Popen:
        """One more worker (a nanny and its worker process, in a process group of their own) on ``host``."""
        proc = self._start(["worker", self.address, "--host", host, "--nthreads", "1", "--nworkers", "1",
                            "--no-dashboard", "--memory-limit", "0", "--death-timeout", "60"],
                           f"worker{len(self.workers)}", self.env)
        self.workers.append(proc)
        return proc

    def kill(self, worker_pid: int) -> None:
        """SIGKILL the worker process ``worker_pid`` and its nanny (their process group: a machine lost, no restart)."""
        os.killpg(os.getpgid(worker_pid), signal.SIGKILL)

    def _start(self, args: list[str], name: str, env: dict) -> subprocess.Popen:
        log = open(os.path.join(self.log_dir, f"{name}.log"), "w")
        return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def wait_for(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(n, timeout=timeout)

    def stop(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def cluster(hosts: list[str], log_dir: str) -> Iterator[Cluster]:
    started = Cluster(hosts, log_dir)
    try:
        yield started
    finally:
        started.stop()
