"""A job's flow run started on Prefect's API, which may be restarting (its server, or the database under it): one
warning line and a wait of up to ``--service-wait``, not a traceback."""

from __future__ import annotations

import sys
import time

import httpx

from prefect_hyperband.common.errors import causes
from prefect_hyperband.flows.params import flat


def started(start, params):
    """The job's flow run (``start()``, a ``FlowStart``), its final state; while Prefect's API cannot start it (its
    server or database restarting: ``/ready`` not ready, or a 5xx or no connection past the client's own retries),
    one warning line, then tried again until ``service_wait`` seconds; past that, one line and None (the CLI's exit
    75). Once the flow's body began, its errors are its own."""
    from prefect_hyperband.flows.tune import bodies_begun

    deadline, warned = time.monotonic() + params.service_wait, False
    while True:
        why = api_not_ready()
        if why is None:
            try:
                return start()
            except Exception as exc:  # noqa: BLE001  (sorted below: an unavailable API, or not ours to handle)
                if params.job_id in bodies_begun or not unavailable(exc):
                    raise
                why = one_line_of(exc)
            finally:
                bodies_begun.discard(params.job_id)  # the set holds the jobs being started now, none after
        if time.monotonic() >= deadline:
            print(f"hyperband: error: the Prefect API could not start job {params.job_id} for "
                  f"{params.service_wait:g} s (--service-wait): {why}; nothing ran, run the same command again",
                  file=sys.stderr)
            return None
        if not warned:
            print(f"hyperband: warning: the Prefect API cannot start the job's flow run ({why}); waiting up to "
                  f"{params.service_wait:g} s (--service-wait)", file=sys.stderr)
            warned = True
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))


class FlowStart:
    """A job's flow run, made here once and run by Prefect's engine (``run_flow``, as ``flow(...)`` runs it): a start
    the API broke off after the run was made (a 500 from a database connection PostgreSQL's restart dropped, after
    the run went Running and before its body began) is tried again as the same flow run, so a job never leaves a
    second flow run Running or Pending behind it. Inside another flow run it is that run's subflow, Prefect's way."""

    def __init__(self, flow, params) -> None:
        self.flow, self.params, self.flow_run = flow, params, None

    def __call__(self):
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext, TagsContext
        from prefect.flow_engine import run_flow
        from prefect.states import Pending
        from prefect.utilities.callables import get_call_parameters

        values = flat(self.params)
        if FlowRunContext.get() is not None:
            return self.flow(**values, return_state=True)
        parameters = get_call_parameters(self.flow.fn, (), values)
        with get_client(sync_client=True) as client:
            if self.flow_run is not None:  # an earlier try's: as the API holds it now (Pending or Running)
                self.flow_run = client.read_flow_run(self.flow_run.id)
            if self.flow_run is None or self.flow_run.state is None or self.flow_run.state.is_final():
                self.flow_run = client.create_flow_run(
                    self.flow, parameters=self.flow.serialize_parameters(parameters), state=Pending(),
                    tags=TagsContext.get().current_tags)
        return run_flow(self.flow, flow_run=self.flow_run, parameters=parameters, return_type="state")


def api_not_ready() -> str | None:
    """Why Prefect's API cannot start a flow run now (``GET /ready``: its database unreachable, 503; another 5xx; no
    connection), else None. Asked once, without the client's retries: a flow run's creation would retry such
    answers itself, silently, for up to half an hour (``PREFECT_CLIENT_MAX_RETRIES`` 10, backoff 2^n s), past
    ``--service-wait`` and without a word; an API without ``/ready`` (404) is taken as ready."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    if not PREFECT_API_URL.value():  # no server to wait for: Prefect runs its API in this process
        return None
    try:
        with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(sync_client=True) as client:
            client.request("GET", "/ready")
    except Exception as exc:  # noqa: BLE001  (an unavailable API is waited for; anything else is the flow call's)
        return one_line_of(exc) if unavailable(exc) else None
    return None


def unavailable(exc: BaseException) -> bool:
    """A server error (5xx), a timeout or no connection from the API, anywhere in the exception's chain."""
    return any(isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500
               or isinstance(e, (httpx.TransportError, ConnectionError)) for e in causes(exc))


def one_line_of(exc: BaseException) -> str:
    """An API error in one line: the status and the request, or the exception's type and first line."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{exc.response.status_code} {exc.response.reason_phrase} for {exc.request.method} {exc.request.url}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
