"""The process around a job: signals that stop the job, a second signal that exits at once, and Prefect's temporary
server (started in its own session, stopped). The Prefect internals it needs for that are ``tasks.prefect_internals``'s
(``started_by``, ``temporary_servers``, ``process_of``, ``take_up``, ``drain_services``)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prefect_hyperband.common.errors import InputError, on_stderr, seconds_from_env
from prefect_hyperband.common.files import file_lock
from prefect_hyperband.common.ports import free_port
from prefect_hyperband.executors.loop import signal_name
from prefect_hyperband.executors.threads import stuck
from prefect_hyperband.flows.server import OUR_APP, batch_server_writes
from prefect_hyperband.tasks import prefect_internals
from prefect_hyperband.trainers.stopping import StopToken


@contextlib.contextmanager
def stop_on_signals(token: StopToken, kill: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Ctrl-C or SIGTERM (in the main thread: the CLI, a deployment's flow-run process) requests the stop on
    ``token``; a second signal calls ``kill`` (what the job started), stops the temporary server and exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if token.requested():
            kill()
            stop_temporary_servers(kill=True)
            os._exit(128 + signum)
        token.request(signum)
        print(f"hyperband: {signal_name(signum)}: stopping within ~10 s, the job is saved for --resume "
              "(again to exit at once)", file=sys.stderr, flush=True)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def stop_temporary_servers(kill: bool = False) -> None:
    """Prefect's temporary servers started by this process: killed at once, or stopped (terminate, then kill)."""
    try:
        for server in prefect_internals.temporary_servers():
            if kill and prefect_internals.process_of(server) is not None:
                prefect_internals.process_of(server).kill()
            elif not kill:
                server.stop()
    except Exception:  # leaving the process anyway: what could not be stopped dies with its parent
        pass


@dataclass(eq=False)
class Launched:
    """A temporary server's process started ahead (``launch_temporary_server``), booting while the job prepares; the
    start-up lock is held until ``temporary_server`` has seen it answer, or ``cancel``."""

    port: int
    process: Any
    held: contextlib.ExitStack
    began: float = field(default_factory=time.monotonic)  # the start's bound counts from here

    def cancel(self) -> None:
        """The job will not run (bad input found by the preflight): the server killed, not waited for (Prefect's
        migrations are one transaction each, so one cut short is taken up by the next start), the lock released."""
        try:
            self.process.kill()
            self.process.wait()
        finally:
            self.held.close()


def launch_temporary_server() -> Launched | None:
    """Without ``PREFECT_API_URL``, the temporary server's process started now, as Prefect would start it (command
    and environment: ``_uvicorn``), with ``flows.server``'s app, in its own session: it boots (3.4 s here) while the
    job imports and checks its input instead of after; ``temporary_server(launched)`` then waits for it."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None

    batch_server_writes()  # the server inherits them: its event consumers write in batches
    held = contextlib.ExitStack()
    # one start at a time per PREFECT_HOME: two jobs started together would both migrate its new database (one
    # server then fails its start-up and Prefect retries it on another port); the second waits for the first's
    held.enter_context(file_lock(_server_log().with_name("temporary-server.lock")))
    try:
        port = free_port()  # the OS's pick (a port taken meanwhile: Prefect's start retries on another, below)
        return Launched(port, _uvicorn(port), held)
    except BaseException:
        held.close()
        raise


#: the bound on a temporary server's start, in seconds: a first start migrates a new database (11-13 s on an idle
#: 2-core machine, past Prefect's own 20 s on a busy or slower one)
START_TIMEOUT = "HYPERBAND_SERVER_START_TIMEOUT"
START_TIMEOUT_DEFAULT = 300.0
#: a start that takes longer than this says what it waits for, in one line
SAY_AFTER = 5.0
_starting = threading.Lock()  # two jobs of one process (threads) share one start


class ServerNotStarted(ConnectionError):
    """Prefect's temporary server did not answer within ``HYPERBAND_SERVER_START_TIMEOUT``, or exited while
    starting; the message is one line naming the setting (the CLI exits 75)."""


def start_timeout() -> float:
    """``HYPERBAND_SERVER_START_TIMEOUT`` in seconds (``InputError`` for a value that is not one)."""
    return seconds_from_env(START_TIMEOUT, START_TIMEOUT_DEFAULT)


def temporary_server(launched: Launched | None = None, say: Callable[[str], None] | None = None):
    """Without ``PREFECT_API_URL``, the temporary Prefect server the job talks to (``launched`` ahead, or started
    now), started in its own session: a terminal's Ctrl-C reaches the job's process group only, so the server
    outlives the signal long enough for the job to save its state and end its runs, and is stopped at exit by
    Prefect's own hook, after its event and log workers have drained (Prefect starts it in the job's group, where
    the same Ctrl-C killed it first and left those workers retrying forever). It is Prefect's
    ``SubprocessASGIServer``, the process's singleton, so that Prefect's clients find it running.

    The start is waited for up to ``HYPERBAND_SERVER_START_TIMEOUT`` (``say`` gets one line past ``SAY_AFTER``),
    not Prefect's 20 s; past it, ``ServerNotStarted``, the server left starting for a retry in this process (the
    migrations it committed are kept in any case). Jobs of one process that start together share one start."""
    if launched is None:
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            return None
    from prefect.server.api import server as prefect_server

    try:
        bound = start_timeout()
    except InputError:
        if launched is not None:
            launched.cancel()
        raise
    with _starting:
        instance = prefect_server.SubprocessASGIServer()
        if instance.running:  # started by an earlier job of this process
            if launched is not None:
                launched.cancel()
            return instance
        launched = launched or _left_starting(instance) or launch_temporary_server()
        with launched.held:
            try:
                _wait_for_health(launched, bound, say or on_stderr)
            except ServerNotStarted:
                prefect_internals.take_up(instance, launched.port, launched.process)  # a retry takes it up
                raise
            ahead = [launched.process]

            def run_uvicorn() -> Any:  # Prefect's start: the process that answered; after an exit 3 (port taken) anew
                return ahead.pop() if ahead else _uvicorn(instance.port)

            prefect_internals.take_up(instance, launched.port)
            with prefect_internals.started_by(instance, run_uvicorn):
                instance.start()
    return instance


def _left_starting(instance: Any) -> Launched | None:
    """The server a start that ran out of time left starting (``instance.server_process``, not running yet), taken
    up by the next start of this process instead of a new one; None when there is none, or it died."""
    process = prefect_internals.process_of(instance)
    if instance.running or process is None or process.poll() is not None:
        return None

    held = contextlib.ExitStack()
    held.enter_context(file_lock(_server_log().with_name("temporary-server.lock")))
    return Launched(instance.port, process, held)


def _wait_for_health(launched: Launched, bound: float, say: Callable[[str], None]) -> None:
    """Until the launched server answers ``/api/health``: one line past ``SAY_AFTER`` seconds, a new process on a
    new port when it exits 3 (its port was taken meanwhile), ``ServerNotStarted`` when it exits otherwise or past
    ``bound`` seconds since its launch (wall time: Prefect's own wait counts only its sleeps)."""
    begun = launched.began
    said = False
    while not _healthy(launched.port):
        code = launched.process.poll()
        if code == 3:
            launched.port = free_port()
            launched.process = _uvicorn(launched.port)
            continue
        waited = time.monotonic() - begun
        if code is not None:
            raise ServerNotStarted(f"Prefect's temporary server exited with code {code} while starting, after "
                                   f"{waited:.0f} s (its log: {_server_log()}); run again, or set PREFECT_API_URL to "
                                   "a server you run")
        if waited >= bound:
            raise ServerNotStarted(f"Prefect's temporary server did not answer within {bound:g} s "
                                   f"({START_TIMEOUT}; its log: {_server_log()}); run again (what its start did is "
                                   "kept), raise the bound, or set PREFECT_API_URL to a server you run")
        if not said and waited >= SAY_AFTER:
            say(f"waiting for Prefect's temporary server to start (a first start creates its database in "
                f"{_server_log().parent}); up to {bound:g} s ({START_TIMEOUT})")
            said = True
        time.sleep(0.1)


def _healthy(port: int) -> bool:
    """The server on ``port`` answers ``GET /api/health`` with 200 (as Prefect's start asks)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _uvicorn(port: int) -> Any:
    """Prefect's temporary server process (the command and environment of ``SubprocessASGIServer``'s
    ``_run_uvicorn_command``, kept equal by a test) with ``flows.server``'s app, in a session of its own, dying
    with the job, its output in a log file."""
    import prefect
    from prefect.settings import get_current_settings

    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory", OUR_APP,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"]
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    # its own errors (a shutdown's CancelledError traceback, SQLite's "database is locked" it retries) go to a
    # log file, not into the job's output
    with _server_log().open("ab") as log:
        return kept_popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def kept_popen(argv: list[str], **kwargs: Any) -> Any:
    """``subprocess.Popen(argv, **kwargs)`` dying with this process (``_die_with_parent``), started from a daemon
    thread that waits on it: Linux sends that signal when the *thread* that started the child ends, and a job
    started in a thread (``hb.tune`` from a pool) ended its thread while another job of the process still used the
    server (measured: the child of an ended thread is SIGTERMed at once)."""
    started: queue.Queue[Any] = queue.Queue()

    def keep() -> None:
        try:
            child = subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)
        except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread below)
            started.put(exc)
            return
        started.put(child)
        child.wait()

    threading.Thread(target=keep, name="hyperband-server-keeper", daemon=True).start()
    child = started.get()
    if isinstance(child, BaseException):
        raise child
    return child


def _server_log() -> Path:
    from prefect.settings import PREFECT_HOME

    path = Path(PREFECT_HOME.value()) / "temporary-server.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _die_with_parent() -> None:
    """In the server's process, before it runs: SIGTERM it when the job's process dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def big_blocks_to_the_os() -> None:
    """glibc's malloc: every block of 1 MiB or more mapped from the OS and given back when freed
    (``M_MMAP_THRESHOLD`` fixed). Its default threshold rises to each large block freed (up to 32 MiB), after which
    such blocks come from the arena of the thread that asked and stay there: a job scoring 1.8 million validation
    rows (a 1 GB table on Dask, the AUC's sorts and ranks, ~80 MB) in a new thread per trial-rung grew its process by
    ~54 MB per trial-rung (542 -> 975 MB over six); with the threshold fixed it stayed at 542-553 MB."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (malloc.h), 1 MiB
    except (OSError, AttributeError):  # not glibc: its own allocator's policy
        pass


def exit_without_stuck(code: int) -> int:
    """``code``, or, when a training given up on its timeout or a stop's grace still runs in this process (user
    code that hangs and never reports), exit now: Prefect's workers drained, the temporary server stopped, the
    hung thread not waited for."""
    hung = stuck()
    if not hung:
        return code
    print(f"hyperband: {hung} training(s) given up (on --trial-timeout or the stop's grace) still run; exiting without "
          "them", file=sys.stderr)
    try:
        prefect_internals.drain_services(timeout=10)
        stop_temporary_servers()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _TaskRunInfo(logging.Filter):
    """Off the Prefect API: each task run's INFO lines ("Finished in state Completed()", two per trial-rung), which
    buried the job's own lines in the flow run's Logs tab (2,723 task runs at 1,359 trial-rungs); their warnings and
    errors stay, and every line stays in the job's ``job.log``. The task runs' states are in the UI either way.
    Prefect's flow-run and task-run loggers share one API handler: the flow run's own INFO lines (the job's) pass."""

    users = 0
    lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("prefect.task_runs")


_TASK_RUN_INFO = _TaskRunInfo()


@contextlib.contextmanager
def job_lines_in_ui() -> Iterator[None]:
    """While a job runs in this process: the flow run's log in the UI carries the job's lines (``_TaskRunInfo``)."""
    from prefect.logging.handlers import APILogHandler

    handlers = [h for h in logging.getLogger("prefect.task_runs").handlers if isinstance(h, APILogHandler)]
    with _TaskRunInfo.lock:
        _TaskRunInfo.users += 1
        for handler in handlers:
            handler.addFilter(_TASK_RUN_INFO)  # once: a filter already on a handler is not added again
    try:
        yield
    finally:
        with _TaskRunInfo.lock:
            _TaskRunInfo.users -= 1
            if not _TaskRunInfo.users:
                for handler in handlers:
                    handler.removeFilter(_TASK_RUN_INFO)
