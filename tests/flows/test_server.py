import os

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
