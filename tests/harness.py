"""Prefect's test harness for the suite and the benchmarks: a temporary server (this process's settings pointing at
it) running ``OUR_APP``, as the CLI's temporary server does. Test infrastructure: the installed package imports
nothing from ``prefect.testing``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx


@contextlib.contextmanager
def harness(startup_timeout: int = 180) -> Iterator[None]:
    import subprocess

    from prefect.testing.utilities import prefect_test_harness

    from prefect_hyperband.flows.server import with_our_app
    from prefect_hyperband.tasks.prefect_internals import starting_our_app

    with contextlib.ExitStack() as started:
        for attempt in range(3):
            try:
                with starting_our_app(with_our_app(subprocess.Popen)):  # only while it starts
                    started.enter_context(prefect_test_harness(server_startup_timeout=startup_timeout))
                break
            except httpx.TransportError:  # Prefect's start waits out a refused connection only: a reset under
                _stop_unstarted()  # load ends it (seen on a 2-core machine running two test workers)
                if attempt == 2:
                    raise
        yield


def _stop_unstarted() -> None:
    """The server process of a harness whose start failed (Prefect registers it as the default before starting)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.pop(None, None)
    process = getattr(server, "server_process", None)
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=30)
