"""Starting a job's flow run on a Prefect API that may be restarting: one warning line and a wait, not a traceback."""

from __future__ import annotations

import pytest


class _Clock:
    """``time`` for the CLI's wait: sleeping moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _api_down(status: int = 500):
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1:4200/api/flow_runs/")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError(f"Server error '{status}'", request=request, response=response)


def test_a_flow_run_the_api_cannot_start_is_waited_for_with_one_warning_line(monkeypatch, capsys):
    """PostgreSQL restarting under the Prefect server: the job's flow run is created once it is back."""
    from prefect_hyperband.app import starting
    from prefect_hyperband.flows.params import TuneParams

    monkeypatch.setattr(starting, "time", _Clock())
    monkeypatch.setattr(starting, "api_not_ready", lambda: None)
    answers = [_api_down(), _api_down(503), "the final state"]

    def start():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert starting.started(start, TuneParams(job_id="j1", service_wait=60)) == "the final state"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hyperband: warning: the Prefect API cannot start the job's flow run (500 Internal Server Error "
                   "for POST http://127.0.0.1:4200/api/flow_runs/); waiting up to 60 s (--service-wait)"]


def test_an_api_whose_database_is_down_is_waited_for_before_the_flow_run_is_created(monkeypatch, capsys):
    """Prefect's client would retry the flow run's creation itself for half an hour, silently: the job asks the
    API's ``/ready`` first, and while it is not ready says so in one line and waits, the flow not yet called."""
    from prefect_hyperband.app import starting
    from prefect_hyperband.flows.params import TuneParams

    clock = _Clock()
    monkeypatch.setattr(starting, "time", clock)
    answers = ["503 Service Unavailable for GET http://127.0.0.1:4200/api/ready", "ConnectError: refused", None]
    monkeypatch.setattr(starting, "api_not_ready", lambda: answers.pop(0))
    called = []
    assert starting.started(lambda: called.append(clock.now) or "done",
                        TuneParams(job_id="j3", service_wait=60)) == "done"
    assert called == [10.0] and not answers  # after two waits of 5 s, once
    assert capsys.readouterr().err.strip().splitlines() == [
        "hyperband: warning: the Prefect API cannot start the job's flow run (503 Service Unavailable for GET "
        "http://127.0.0.1:4200/api/ready); waiting up to 60 s (--service-wait)"]


@pytest.mark.parametrize("answer, said", [
    (503, "503 Service Unavailable for GET http://127.0.0.1:{port}/api/ready"),  # its database unreachable
    (500, "500 Internal Server Error for GET http://127.0.0.1:{port}/api/ready"),
    (404, None),  # an API without /ready: taken as ready
    (200, None),
    (None, "ConnectError: "),  # nothing listening
])
def test_the_readiness_probe_asks_the_api_once_without_the_clients_retries(answer, said):
    """``_api_not_ready`` against a real HTTP server: one request (Prefect's client retries a 503 ten times)."""
    import http.server
    import threading

    from ports import free_port
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.app import starting

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            asked.append(self.path)
            self.send_response(answer)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler) if answer else None
    if server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            why = starting.api_not_ready()
    finally:
        if server:
            server.shutdown()
            server.server_close()
    if said is None:
        assert why is None
    else:
        assert why is not None and why.startswith(said.format(port=port)), why
    assert asked == (["/api/ready"] if answer else [])


def test_past_the_service_wait_the_job_stops_in_one_line_exit_75(monkeypatch, capsys):
    from prefect_hyperband.app import starting
    from prefect_hyperband.flows.params import TuneParams

    clock = _Clock()
    monkeypatch.setattr(starting, "time", clock)
    monkeypatch.setattr(starting, "api_not_ready", lambda: None)

    def start():
        raise _api_down()

    assert starting.started(start, TuneParams(job_id="j2", service_wait=30)) is None  # the CLI's exit 75
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("hyperband: warning: ")
    assert err[1].startswith("hyperband: error: the Prefect API could not start job j2 for 30 s (--service-wait)")
    assert 30 <= clock.now <= 35


def test_an_error_once_the_job_began_or_not_from_the_api_is_not_retried(monkeypatch):
    from prefect_hyperband.app import starting
    from prefect_hyperband.flows import tune as tune_module
    from prefect_hyperband.flows.params import TuneParams

    monkeypatch.setattr(starting, "time", _Clock())
    monkeypatch.setattr(starting, "api_not_ready", lambda: None)
    calls = []

    def start(job_id):
        calls.append(job_id)
        raise _api_down() if job_id == "began" else ValueError("a bug")

    monkeypatch.setattr(tune_module, "bodies_begun", {"began"})
    with pytest.raises(Exception, match="Server error"):
        starting.started(lambda: start("began"), TuneParams(job_id="began"))
    with pytest.raises(ValueError):
        starting.started(lambda: start("other"), TuneParams(job_id="other"))
    assert calls == ["began", "other"]


def test_a_start_the_api_broke_off_after_its_run_went_running_is_that_same_flow_run(
        prefect_harness, tracking_uri, tmp_path, monkeypatch, capsys):
    """PostgreSQL's fast shutdown under the Prefect server: a pooled connection it dropped answers the engine's read
    of the flow run, after the run went Running and before the job's body began, with a 500. The job waits in one
    line and starts again as the same flow run: one flow run for the job, Completed, none left Running."""
    from prefect.client.orchestration import SyncPrefectClient, get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    import prefect_hyperband as hb
    from prefect_hyperband.app import starting

    made, reads, real_create, real_read = [], [], SyncPrefectClient.create_flow_run, SyncPrefectClient.read_flow_run

    def create(self, *args, **kwargs):
        flow_run = real_create(self, *args, **kwargs)
        made.append(flow_run.id)
        return flow_run

    def read(self, flow_run_id):
        reads.append(flow_run_id)
        if len(reads) == 1:  # the engine's first read, the run Running by now: as PostgreSQL's restart answers it
            raise _api_down()
        return real_read(self, flow_run_id)

    monkeypatch.setattr(SyncPrefectClient, "create_flow_run", create)
    monkeypatch.setattr(SyncPrefectClient, "read_flow_run", read)
    monkeypatch.setattr(starting, "time", _Clock())
    result = hb.tune(lambda trial: {"loss": trial.config["x"]}, {"x": {"type": "float", "low": 0, "high": 1}},
                     metric="loss", direction="minimize", max_resource=3, eta=3, seed=1, job_id="broken-off",
                     job_dir=str(tmp_path / "jobs"), register_model=False)
    assert result.summary["trial_rungs"] > 0
    with get_client(sync_client=True) as client:  # the job's flow run and its brackets' subflow runs
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=made)))
    assert [run.id for run in runs if run.parent_task_run_id is None] == [reads[0]]
    assert {run.state.type.value for run in runs} == {"COMPLETED"} and len(runs) == len(made)
    said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(said) == 1 and "cannot start the job's flow run (500" in said[0], said
