"""Background servers for end-to-end tests: each in its own process group, logs kept, torn down at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ports import free_port  # tests/ports.py

BIN = Path(sys.executable).parent


def _free_port() -> int:
    return free_port("127.0.0.1")


def _exe(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else name


class Stack:
    """Background processes with their logs; each in its own session (process group)."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp, self.env = tmp, env
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, argv: list[str], cwd: Path | None = None, **extra: str) -> subprocess.Popen:
        """``argv`` in the background; ``extra``: environment variables of this process only."""
        log = self.tmp / f"{name}.log"
        out = log.open("ab")  # a restarted server's log goes on
        proc = subprocess.Popen(argv, cwd=cwd or self.tmp, env={**self.env, **extra}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.procs.append((name, proc, log))
        return proc

    def run(self, name: str, argv: list[str], cwd: Path | None = None, timeout: float = 180) -> str:
        log = self.tmp / f"{name}.log"
        proc = subprocess.run(argv, cwd=cwd or self.tmp, env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        log.write_text(f"$ {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
        if proc.returncode != 0:
            raise AssertionError(f"{name} failed (exit {proc.returncode}):\n{_tail(proc.stdout + proc.stderr, 60)}")
        return proc.stdout

    def halt(self, name: str, sig: int = signal.SIGTERM, grace: float = 20) -> list[str]:
        """Stop one background process (its group) with ``sig`` and forget it; its argv, to start it again.

        As a service manager does (systemd's stop timeout, Kubernetes' grace period): a group still there
        ``grace`` seconds after ``sig`` is killed. A Prefect server under ten jobs once took over 60 s to
        finish its graceful shutdown (uvicorn waits for open requests and its lifespan)."""
        for i, (n, proc, _) in enumerate(self.procs):
            if n == name:
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    print(f"{name}: still running {grace:.0f} s after signal {sig}, killed", file=sys.stderr)
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what the group leader left behind
                del self.procs[i]
                return proc.args
        raise KeyError(name)

    def check_alive(self) -> None:
        for name, proc, _ in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited early with code {proc.returncode}")

    def dump_logs(self, lines: int = 60) -> None:
        for log in sorted(self.tmp.glob("*.log")):
            text = log.read_text(errors="replace")
            print(f"\n===== {log.name} (last {lines} lines) =====\n{_tail(text, lines)}", file=sys.stderr)

    def stop(self) -> None:
        import psutil

        doomed: list[psutil.Process] = []
        for _, proc, _ in reversed(self.procs):  # worker first, servers last
            try:
                parent = psutil.Process(proc.pid)
                doomed += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        for p in doomed:  # children that left the group (e.g. a flow run in its own session)
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(doomed, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        for _, proc, _ in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=10)
        self.left = [p.pid for p in doomed if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@contextlib.contextmanager
def running(request: Any, tmp: Path, env: dict[str, str]) -> Iterator[Stack]:
    """A fixture's ``Stack``: its processes' logs printed when the test (or the fixture) failed, every
    process stopped, none left running. pytest does not raise a test's failure inside its fixtures: the
    outcome comes from ``request.node.rep_call`` (``tests/deployments/conftest.py``)."""
    s = Stack(tmp, env)
    try:
        yield s
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            s.dump_logs()
        s.stop()
    assert not s.left, f"processes still running after teardown: {s.left}"


def server_env(tmp: Path, database_url: str, prefect_port: int, **extra: str) -> dict[str, str]:
    """The environment of a test's own servers and CLIs: none of the caller's Prefect or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PREFECT_HOME=str(tmp / "prefect-home"),
        PREFECT_API_DATABASE_CONNECTION_URL=database_url,
        PREFECT_API_URL=f"http://127.0.0.1:{prefect_port}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


RETRYABLE = (429, 502, 503)  # what Prefect's and MLflow's own clients try again on


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10, retries: int = 5) -> dict:
    """One JSON request, tried again on a 429, 502 or 503 as Prefect's client does (``Retry-After``, else 1, 2, 4, ...
    s, ``retries`` times): a Prefect server on SQLite answers 503 while its database is locked by its own services."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
            return json.loads(text) if text else {}
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRYABLE or attempt == retries:
                raise
            time.sleep(float(exc.headers.get("Retry-After") or 2**attempt))
    raise AssertionError("unreachable")


def _wait_http(url: str, stack: Stack, what: str, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise AssertionError(f"{what} did not answer at {url} within {timeout:.0f}s")


def _wait_log(stack: Stack, name: str, pattern: str, count: int, timeout: float = 90) -> None:
    log = stack.tmp / f"{name}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        if log.exists() and len(re.findall(pattern, log.read_text(errors="replace"))) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"{name}: {pattern!r} not seen {count}x within {timeout:.0f}s")


class FlakyProxy:
    """An HTTP proxy in front of a server (MLflow's) that answers 503 to every request while told to (``down_for``)
    and counts the 503s it gave. ``on_first_upload``: called once, before the first artifact upload
    (``PUT .../mlflow-artifacts/...``) goes on to the server (a test makes the server's artifact store read-only
    there); ``failed_uploads`` counts the uploads the server itself answered with a 5xx."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading

        self.upstream, self.until = upstream, 0.0
        self.refused = {"all": 0}
        self.on_first_upload: Any = None
        self.uploads = self.failed_uploads = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = proxy.refusing(self.command, self.path)
                if kind:
                    proxy.refused[kind] += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
                request = urllib.request.Request(proxy.upstream + self.path, data=body if body else None,
                                                 method=self.command, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        status, data, got = response.status, response.read(), response.headers
                except urllib.error.HTTPError as err:
                    status, data, got = err.code, err.read(), err.headers
                except OSError:
                    status, data, got = 502, b"", {}
                if status >= 500 and self.command == "PUT" and "mlflow-artifacts" in self.path:
                    proxy.failed_uploads += 1
                self.send_response(status)
                for k, v in got.items():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def down_for(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def refusing(self, method: str, path: str) -> str | None:
        if time.monotonic() < self.until:
            return "all"
        if method == "PUT" and "mlflow-artifacts" in path:
            self.uploads += 1
            if self.uploads == 1 and self.on_first_upload is not None:
                self.on_first_upload()
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
