"""A Prefect API that does not answer (its server or database restarting), waited for by a job's trial-rungs on task
workers: one warning line per outage for the whole process, up to ``--service-wait``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from prefect_hyperband.common.errors import first_line, unavailable
from prefect_hyperband.tracking.service_wait import client_waits

#: seconds between tries of a Prefect API that does not answer, and the least a trial-rung waits for it
API_RETRY_SECONDS = 1.0
API_WAIT_AT_LEAST = 60.0
#: seconds after the API answers again within which a failure is the same outage (a restarted server's 503s): unsaid
OUTAGE_QUIET = 60.0
#: when the Prefect API stopped answering this process's trial-rungs (None: it answers) and last answered again
_OUTAGE: dict[str, float | None] = {"since": None, "back": None}
_OUTAGE_LOCK = threading.Lock()
log = logging.getLogger(__name__)
T = TypeVar("T")


def answering(call: Callable[[], T]) -> tuple[T, bool]:
    """``call()`` (a request to the Prefect API), tried again every ``API_RETRY_SECONDS`` while the API does not
    answer (its server or database restarting), for as long as the job waits for MLflow (``--service-wait``:
    ``service_wait.client_waits``), and whether it waited. One warning line per outage for the whole process (its
    trial-rungs all wait); past the bound, the error (the loop stops the job: exit 75, ``--resume``)."""
    began, waited = time.monotonic(), False
    while True:
        try:
            value = call()
        except Exception as exc:
            bound = max(client_waits(), API_WAIT_AT_LEAST)
            if not unavailable(exc) or time.monotonic() - began > bound:
                raise
            with _OUTAGE_LOCK:
                back = _OUTAGE.get("back")
                if _OUTAGE["since"] is None and back is not None and time.monotonic() - back < OUTAGE_QUIET:
                    _OUTAGE["since"] = back  # the same outage, already said
                if _OUTAGE["since"] is None:
                    _OUTAGE["since"] = time.monotonic()
                    log.warning("the Prefect API does not answer (%s: %s); the trial-rungs wait for it, up to %.0f s",
                                type(exc).__name__, first_line(exc), bound)
            waited = True
            time.sleep(API_RETRY_SECONDS)
            continue
        if waited:
            with _OUTAGE_LOCK:
                if _OUTAGE["since"] is not None:
                    log.info("the Prefect API answers again, after %.0f s", time.monotonic() - _OUTAGE["since"])
                    _OUTAGE["since"], _OUTAGE["back"] = None, time.monotonic()
        return value, waited
