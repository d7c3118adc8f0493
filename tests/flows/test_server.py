import os

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
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: seen.append((a, k)) or "process")
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
    assert ours_kw["env"] == theirs_kw["env"]
    assert {k: float(ours_kw["env"][k]) for k in server.BATCHED_WRITES} == {
        k: float(v) for k, v in server.BATCHED_WRITES.items()}  # as Prefect's settings write them back ("1.0")
    assert ours_kw["start_new_session"] and ours_kw["stdout"].name == str(tmp_path / "temporary-server.log")


def test_the_job_takes_the_server_launched_ahead_and_a_port_taken_meanwhile_starts_another(monkeypatch, tmp_path):
    """``temporary_server(launched)``: Prefect's start (its health checks, its retry on another port when the
    server exits 3, port taken) runs on the process launched ahead instead of starting one; the start-up lock is
    held until then. A launch that will not be used (bad input) is killed and lets the lock go at once."""
    import fcntl

    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from prefect_hyperband.flows import process

    started: list[int] = []
    lock = tmp_path / "temporary-server.lock"

    def locked() -> bool:
        with open(lock) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    class Process:
        def __init__(self, port):
            started.append(port)
            self.port, self.killed = port, False

        def kill(self):
            self.killed = True

        def wait(self):
            return -9

    class Server:  # Prefect's, as its start uses it
        running, port = False, None

        def start(self):
            assert locked()
            self.ran = [self._run_uvicorn_command()]
            self.port = 8999  # the first exited 3: Prefect picks another port and runs the command again
            self.ran.append(self._run_uvicorn_command())
            self.running = True

        def _run_uvicorn_command(self):
            raise AssertionError("Prefect's own command: a second server")

    instance = Server()
    monkeypatch.setattr(process, "_uvicorn", Process)
    monkeypatch.setattr(prefect_server, "SubprocessASGIServer", lambda: instance)
    with temporary_settings({PREFECT_HOME: tmp_path}, restore_defaults={PREFECT_API_URL}):
        launched = process.launch_temporary_server()
        assert locked() and started == [launched.port]
        assert process.temporary_server(launched) is instance
        assert [p.port for p in instance.ran] == [launched.port, 8999] and not locked()
        assert process.temporary_server() is instance and len(started) == 2  # running: nothing more started
        unused = process.launch_temporary_server()
        unused.cancel()
    assert unused.process.killed and not locked()


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
