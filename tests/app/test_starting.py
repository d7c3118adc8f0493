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

    def tune(return_state, **fields):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert starting.started(tune, TuneParams(job_id="j1", service_wait=60)) == "the final state"
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
    assert starting.started(lambda return_state, **fields: called.append(clock.now) or "done",
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

    def tune(return_state, **fields):
        raise _api_down()

    assert starting.started(tune, TuneParams(job_id="j2", service_wait=30)) is None  # the CLI's exit 75
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

    def tune(return_state, **fields):  # the flow's keyword per field
        calls.append(fields["job_id"])
        raise _api_down() if fields["job_id"] == "began" else ValueError("a bug")

    monkeypatch.setattr(tune_module, "bodies_begun", {"began"})
    with pytest.raises(Exception, match="Server error"):
        starting.started(tune, TuneParams(job_id="began"))
    with pytest.raises(ValueError):
        starting.started(tune, TuneParams(job_id="other"))
    assert calls == ["began", "other"]
