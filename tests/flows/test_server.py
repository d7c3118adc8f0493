import os
import sys
from types import SimpleNamespace

import pytest

from prefect_hyperband.flows import server


def test_batched_writes_fill_in_what_the_user_left_unset(monkeypatch):
    for name in server.BATCHED_WRITES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE", "7")
    server.batch_server_writes()
    assert os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] == "7"  # the user's value wins
    assert os.environ["PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE"] == "200"


def test_prefect_reads_the_batched_writes_as_its_server_settings(monkeypatch):
    from prefect.settings import Settings

    for name, value in server.BATCHED_WRITES.items():
        monkeypatch.setenv(name, value)
    services = Settings().server.services
    assert services.task_run_recorder.batch_size == 200 and services.task_run_recorder.flush_interval == 1
    assert services.event_persister.batch_size == 200 and services.event_persister.flush_interval == 1


def test_the_server_launched_ahead_is_prefects_own_command_with_our_app_and_the_batched_writes(monkeypatch, tmp_path):
    """The CLI starts Prefect's temporary server before the job's preflight: the command and environment Prefect's
    ``SubprocessASGIServer`` would use (compared with its own, so that a new Prefect changing them fails here), our
    app in Prefect's place, the batched writes inherited, in a session of its own with its output in a log file."""
    import subprocess

    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from prefect_hyperband.flows import process

    seen: list[tuple[tuple, dict]] = []
    for name in server.BATCHED_WRITES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: seen.append((a, k)) or SimpleNamespace(wait=int))
    with temporary_settings({PREFECT_HOME: tmp_path}, restore_defaults={PREFECT_API_URL}):
        launched = process.launch_temporary_server()
        launched.held.close()
        prefects = SubprocessASGIServer(port=launched.port)
        try:
            prefects._run_uvicorn_command()
        finally:
            SubprocessASGIServer._instances.pop(launched.port, None)
    (ours, ours_kw), (theirs, theirs_kw) = seen
    assert ours[0] == [server.OUR_APP if a == server.PREFECTS_APP else a for a in theirs_kw["args"]]
    assert server.OUR_APP in ours[0] and f"{launched.port}" in ours[0]
    assert ours_kw["env"] == theirs_kw["env"] and ours_kw["preexec_fn"] is process._die_with_parent
    assert {k: float(ours_kw["env"][k]) for k in server.BATCHED_WRITES} == {
        k: float(v) for k, v in server.BATCHED_WRITES.items()}  # as Prefect's settings write them back ("1.0")
    assert ours_kw["start_new_session"] and ours_kw["stdout"].name == str(tmp_path / "temporary-server.log")


def _locked(lock) -> bool:
    import fcntl

    with open(lock) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


class _Process:
    """A server process as the start sees it: ``poll`` gives ``exits`` (None: running), ``kill`` marks it."""

    def __init__(self, port, exits=None):
        self.port, self.exits, self.killed = port, exits, False

    def poll(self):
        return self.exits

    def kill(self):
        self.killed = True

    def wait(self):
        return -9


class _Server:  # Prefect's SubprocessASGIServer, as the start uses it
    def __init__(self):
        self.running, self.port, self.server_process, self.starts = False, None, None, 0

    def start(self):
        self.starts += 1
        self.server_process = self._run_uvicorn_command()
        self.running = True

    def _run_uvicorn_command(self):
        raise AssertionError("Prefect's own command: a second server")


@pytest.fixture
def fake_start(monkeypatch, tmp_path):
    """``flows.process`` with a fake Prefect server, fake processes (``started``: each one launched) and a health
    check that answers once the process's port is in ``answering``; ``said`` collects the start's lines."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from prefect_hyperband.flows import process

    state = SimpleNamespace(started=[], answering=set(), exits={}, said=[], instance=_Server(), polls=0,
                            lock=tmp_path / "temporary-server.lock", process=process)

    def launch(port):
        state.started.append(_Process(port, state.exits.pop(len(state.started), None)))
        return state.started[-1]

    def healthy(port):
        state.polls += 1
        return port in state.answering or (state.answer_after is not None and state.polls > state.answer_after)

    state.answer_after = 0
    monkeypatch.setattr(process, "_uvicorn", launch)
    monkeypatch.setattr(process, "_healthy", healthy)
    monkeypatch.setattr(process, "on_stderr", state.said.append)
    monkeypatch.setattr(prefect_server, "SubprocessASGIServer", lambda: state.instance)
    with temporary_settings({PREFECT_HOME: tmp_path}, restore_defaults={PREFECT_API_URL}):
        yield state


def test_the_job_takes_the_server_launched_ahead_and_a_port_taken_meanwhile_starts_another(fake_start, monkeypatch):
    """``temporary_server(launched)``: the process launched ahead is waited for and handed to Prefect's start (its
    singleton then runs, as Prefect's clients expect); one that exits 3 (its port was taken meanwhile) is started
    again on another port. The start-up lock is held until then. A launch that will not be used (bad input) is
    killed and lets the lock go at once."""
    process, instance = fake_start.process, fake_start.instance
    fake_start.answer_after = None
    fake_start.exits[0] = 3
    launched = process.launch_temporary_server()
    assert _locked(fake_start.lock) and [p.port for p in fake_start.started] == [launched.port]
    first = launched.port

    def health(port):
        assert _locked(fake_start.lock)
        return port != first

    monkeypatch.setattr(process, "_healthy", health)
    assert process.temporary_server(launched) is instance
    assert instance.running and instance.starts == 1 and instance.server_process is fake_start.started[1]
    assert instance.port == fake_start.started[1].port != first and not _locked(fake_start.lock)
    assert process.temporary_server() is instance and len(fake_start.started) == 2  # running: nothing more started
    unused = process.launch_temporary_server()
    unused.cancel()
    assert unused.process.killed and not _locked(fake_start.lock) and fake_start.said == []


def test_a_slow_start_says_in_one_line_what_it_waits_for_and_goes_on(fake_start, monkeypatch):
    """A first start migrates a new database (past Prefect's 20 s on a busy 2-core machine): past ``SAY_AFTER`` the
    job says what it waits for and for how long, once, and waits on."""
    process = fake_start.process
    monkeypatch.setattr(process, "SAY_AFTER", 0.0)
    monkeypatch.setenv("HYPERBAND_SERVER_START_TIMEOUT", "600")
    fake_start.answer_after = 3
    assert process.temporary_server() is fake_start.instance and fake_start.instance.running
    assert len(fake_start.said) == 1
    assert "waiting for Prefect's temporary server to start" in fake_start.said[0]
    assert "up to 600 s (HYPERBAND_SERVER_START_TIMEOUT)" in fake_start.said[0]


def test_a_start_past_its_bound_is_one_error_naming_the_setting_and_a_retry_takes_up_the_same_server(
        fake_start, monkeypatch):
    """Past ``HYPERBAND_SERVER_START_TIMEOUT``: ``ServerNotStarted``, one line naming the setting; the server is
    left starting, and the next job of the process waits for that one instead of starting over."""
    process = fake_start.process
    monkeypatch.setenv("HYPERBAND_SERVER_START_TIMEOUT", "0.2")
    fake_start.answer_after = None
    with pytest.raises(process.ServerNotStarted) as raised:
        process.temporary_server()
    message = str(raised.value)
    assert "did not answer within 0.2 s (HYPERBAND_SERVER_START_TIMEOUT" in message and "\n" not in message
    (left,) = fake_start.started
    assert not left.killed and not fake_start.instance.running and not _locked(fake_start.lock)
    fake_start.answering.add(left.port)
    assert process.temporary_server() is fake_start.instance
    assert fake_start.started == [left] and fake_start.instance.server_process is left


def test_a_server_that_exits_while_starting_is_one_error_naming_its_log(fake_start):
    process = fake_start.process
    fake_start.answer_after = None
    fake_start.exits[0] = 1
    with pytest.raises(process.ServerNotStarted, match="exited with code 1 while starting.*temporary-server.log"):
        process.temporary_server()
    fake_start.exits[1] = None
    fake_start.answer_after = 0
    assert process.temporary_server().running and len(fake_start.started) == 2  # the dead one is not taken up


def test_jobs_of_one_process_starting_together_share_one_start(fake_start):
    """Two ``hb.tune`` calls in two threads: one server launched and started; both get it once it answers."""
    import contextvars
    import threading

    process = fake_start.process
    fake_start.answer_after = 5
    got = []
    # in this test's Prefect settings (a context variable, which a new thread does not inherit)
    threads = [threading.Thread(target=contextvars.copy_context().run,
                                args=(lambda: got.append(process.temporary_server()),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == [fake_start.instance] * 2 and len(fake_start.started) == 1 and fake_start.instance.starts == 1


def test_a_server_started_from_a_thread_outlives_that_thread_and_dies_with_the_process(tmp_path):
    """Linux signals a child whose parent *thread* ends (``PR_SET_PDEATHSIG``): a job in a thread that ended killed
    the server another job of the process used. ``kept_popen`` starts it from a thread that lives as long as it."""
    import subprocess
    import time

    script = ("import threading, time\n"
              "from prefect_hyperband.flows.process import kept_popen\n"
              "got = []\n"
              "t = threading.Thread(target=lambda: got.append(kept_popen(['sleep', '60'])))\n"
              "t.start(); t.join(); time.sleep(0.5)\n"
              "print(got[0].pid, got[0].poll(), flush=True)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid, code = parent.stdout.readline().split()
        assert code == "None"  # alive after its starting thread ended
        parent.kill()
        parent.wait()
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the child outlived its killed parent")
    finally:
        parent.kill()


def test_our_app_replaces_prefects_in_the_servers_command_and_nothing_else():
    seen = []
    start = server.with_our_app(lambda *a, **k: seen.append((a, k)))
    start(args=["python", "-m", "uvicorn", "--factory", server.PREFECTS_APP, "--port", "1"], env={"A": "1"})
    start(["uvicorn", "--factory", server.PREFECTS_APP])
    start(["git", "status"], cwd="/")
    assert seen == [((), {"args": ["python", "-m", "uvicorn", "--factory", server.OUR_APP, "--port", "1"],
                          "env": {"A": "1"}}),
                    ((["uvicorn", "--factory", server.OUR_APP],), {}),
                    ((["git", "status"],), {"cwd": "/"})]


def test_prefects_internals_that_our_app_relies_on_are_as_pinned():
    import inspect

    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.configurations import AioSqliteConfiguration
    from prefect.server.models import flow_runs, task_runs

    assert f'"{server.PREFECTS_APP}"' in inspect.getsource(SubprocessASGIServer._run_uvicorn_command)
    assert list(inspect.signature(AioSqliteConfiguration.begin_transaction).parameters) == [
        "self", "session", "with_for_update"]
    # the reads before the insert that make these two POSTs race a concurrent commit on SQLite
    assert "with_system_labels_for_task_run" in inspect.getsource(task_runs.create_task_run)
    assert "with_system_labels_for_flow_run" in inspect.getsource(flow_runs.create_flow_run)


@pytest.mark.usefixtures("prefect_harness")
def test_subflow_runs_started_together_are_never_answered_503():
    """The session's server runs our app: subflow runs started together (each a task run, then a flow run, both
    read-then-insert, racing each other's commits as a job's groups do) wait for SQLite's write lock instead of
    being answered 503, which Prefect's client would retry 2 s later. Here, with no retries, each would fail:
    on Prefect's own app most of them did."""
    import contextvars
    import threading

    from prefect import flow, task
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from prefect_hyperband.flows.groups import FLOW_NAME

    cmdline = open(f"/proc/{SubprocessASGIServer._instances[None].server_process.pid}/cmdline").read().split("\0")
    assert server.OUR_APP in cmdline and server.PREFECTS_APP not in cmdline

    @task
    def step(i: int) -> int:
        return i

    @flow(name=FLOW_NAME)
    def group(i: int) -> int:
        return step(i)

    @flow
    def job() -> list[int | str]:
        done: list[int | str] = []

        def start(i: int) -> None:
            try:
                done.append(group(i))
            except Exception as exc:  # noqa: BLE001
                done.append(repr(exc))

        for wave in range(2):  # in the job's flow run, as the job's groups
            starts = [threading.Thread(target=contextvars.copy_context().run, args=(start, 4 * wave + i))
                      for i in range(4)]
            for s in starts:
                s.start()
            for s in starts:
                s.join()
        return done

    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
        done = job()
    assert sorted(done, key=str) == list(range(8))
