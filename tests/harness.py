"""Prefect's test harness for the suite and the benchmarks: a temporary server (this process's settings pointing at
it) running ``OUR_APP``, as the CLI's temporary server does. Test infrastructure: the installed package imports
nothing from ``prefect.testing``."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def harness(startup_timeout: int = 180) -> Iterator[None]:
    import subprocess

    from prefect.testing.utilities import prefect_test_harness

    from prefect_hyperband.tasks.prefect_internals import starting_our_app
    from prefect_hyperband.flows.server import with_our_app

    with contextlib.ExitStack() as started:
        with starting_our_app(with_our_app(subprocess.Popen)):  # only while it starts
            started.enter_context(prefect_test_harness(server_startup_timeout=startup_timeout))
        yield
