"""One line for the person running the job, from code the engine runs for a flow (a damaged file read again from
its previous version, a journal's torn record): in the flow run's log (the terminal and the UI) inside a run, on
stderr before one starts (the CLI's checks)."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from prefect_hyperband.common.errors import on_stderr


def in_run(text: str) -> None:
    try:
        get_run_logger().warning(text)
    except MissingContextError:
        on_stderr(text)
