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


def test_the_clis_temporary_server_starts_with_the_batched_writes(monkeypatch):
    from prefect.server.api import server as prefect_server
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.app import cli

    seen: dict[str, str | None] = {}

    class Server:  # stands in for Prefect's: what the server process would inherit when it starts
        def start(self):
            seen.update({name: os.environ.get(name) for name in server.BATCHED_WRITES})

    for name in server.BATCHED_WRITES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(prefect_server, "SubprocessASGIServer", Server)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert isinstance(cli._temporary_server(), Server)
    assert seen == server.BATCHED_WRITES


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
