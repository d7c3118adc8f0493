"""What a CLI job shows on the terminal and keeps in its ``job.log``: the log plumbing of ``hyperband tune``."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefect_hyperband.common.errors import InputError, no_space
from prefect_hyperband.executors.progress import Result, Start
from prefect_hyperband.flows.groups import FLOW_NAME as GROUP_FLOW
from prefect_hyperband.hyperband.first import PRIOR_BRACKET
from prefect_hyperband.tasks import prefect_internals
from prefect_hyperband.tasks.record import CUT_SHORT
from prefect_hyperband.tasks.trials import evaluate_trial, train_trial
from prefect_hyperband.tracking import store as mlflow_store
from prefect_hyperband.tracking.flavours import load_mlflow


def live_display():
    """The live progress display when stderr is a terminal (``HYPERBAND_NO_LIVE=1`` turns it off); else None."""
    if not sys.stderr.isatty() or os.environ.get("HYPERBAND_NO_LIVE") == "1" or os.environ.get("TERM") == "dumb":
        return None

    return LiveDisplay(sys.stderr)


def job_log_path(params) -> str:
    """``<job folder>/job.log``: beside the job's state (the local folder when its storage is a URL)."""
    from prefect_hyperband.flows.prepare import job_root

    return os.path.join(os.path.abspath(job_root(params.job_dir, params.storage)), params.job_id, "job.log")


#: libraries whose INFO lines are the job log's, not the terminal's (MLflow's database set-up, its registry's
#: "Successfully registered model", alembic's migrations); warnings and errors still reach the terminal
CHATTY = ("mlflow", "alembic")


class JobLog:
    """Every log line of the run (Prefect's, MLflow's, the job's) appended to the job's ``job.log``; MLflow's and
    alembic's INFO lines kept off the terminal unless ``verbose``. Lines before the job's folder exists are held in
    memory and written when it does (dropped if the input is refused)."""

    def __init__(self, verbose: bool) -> None:
        from prefect.logging.configuration import setup_logging

        load_mlflow()  # MLflow configures its logger as it is imported; its handler is quieted here

        setup_logging()  # Prefect's console handler first: it leaves out the root logger once another handler is on it
        prefect_internals.api_log_errors_as_warnings(API_LOGS)  # --verbose too
        self.path: str | None = None
        self.held = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
        self.held.setLevel(logging.INFO)
        self.targets = [logging.getLogger(), *(logging.getLogger(name) for name in CHATTY)]
        for logger in self.targets:
            logger.addHandler(self.held)
        if logging.getLogger("prefect_hyperband").level == logging.NOTSET:  # our INFO lines (a group's read) in job.log
            logging.getLogger("prefect_hyperband").setLevel(logging.INFO)
        if not verbose:
            for name in CHATTY:
                for handler in logging.getLogger(name).handlers:
                    if handler is not self.held:
                        handler.setLevel(logging.WARNING)

    def open(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        target = _JobLogFile(path, encoding="utf-8")
        target.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        target.setLevel(logging.INFO)
        self.held.setTarget(target)
        self.held.flush()
        for logger in self.targets:
            logger.removeHandler(self.held)
            logger.addHandler(target)
        self.held, self.path = target, path  # type: ignore[assignment]

    def close(self) -> None:
        for logger in self.targets:
            logger.removeHandler(self.held)
        self.held.close()


class _JobLogFile(logging.FileHandler):
    """``job.log``; on a full disk its lines are dropped, not each printed with a traceback (the job stops and says
    why in one line)."""

    def handleError(self, record) -> None:
        if no_space(sys.exc_info()[1]):
            return
        super().handleError(record)


#: a trial-rung's Prefect tasks: their failure is the job's line "trial T failed at r=R: ..." (or "running it again")
TRIAL_TASKS = frozenset({train_trial.name, evaluate_trial.name})


#: what events Prefect's client could not send cost (said once per job process, whichever way they were lost)
LOST_TASK_RUNS = ("task runs of that moment may be missing in the Prefect UI (every result is in MLflow and the job's "
                  "state)")


class _TerminalFilter:
    """The terminal shows the job's own lines; each task run's lines stay in the Prefect UI (``--verbose``: both).
    Under the live display, only warnings and errors: the display shows the progress the info lines tell."""

    def __init__(self, live: bool = False) -> None:
        self.live = live
        self.said: set[str] = set()  # the kinds of Prefect's lines already said in one line (``_once``)

    def filter(self, record) -> bool:
        if record.name == API_LOGS:  # every batch the API did not take is in job.log; the terminal says it once
            said, self.said = "logs" in self.said, self.said | {"logs"}
            return not said
        if record.name.startswith("websockets"):  # Prefect's event stream, its server restarting: a traceback
            self._stream_dropped(record)
            return False
        message = record.getMessage() if record.name == prefect_internals.SERVICES_LOGGER else ""
        if "'EventsWorker' failed" in message:  # (formatted once: an item's line holds the whole event)
            if "failed to process item" in message:  # one event, its server away: the whole event each
                self._once("lost", record, "the Prefect API's event stream could not send an event (its server "
                                           "away); " + LOST_TASK_RUNS)
                return False
            if " 0 pending" not in message:  # events not sent: task runs missing in the UI
                return True
            self._stream_dropped(record)  # at exit, after the stream dropped: nothing was left to send
            return False
        if record.name == "prefect.events.clients" and str(record.msg).startswith("Unable to connect to"):
            self._events_lost(record)  # its reconnections failed (a line each time it sends): once, in one line
            return False
        if record.name.startswith("prefect.task_runs") and (_stopped(record) or CUT_SHORT in record.getMessage()):
            return False  # the job's stop line says why
        if record.name.startswith("prefect.task_runs") and record.levelno < 30:  # below WARNING
            return False
        if (record.name.startswith("prefect.task_runs") and record.levelno >= 40
                and getattr(record, "task_name", None) in TRIAL_TASKS):
            return False  # a trial-rung that failed: the job's own line says so; the traceback stays in job.log, the UI
        if not record.name.startswith("prefect.flow_runs") and record.levelno < 30:  # Prefect's own (its server's)
            return False
        if self.live and record.name.startswith("prefect.flow_runs") and record.levelno < 30:
            return False
        if getattr(record, "flow_name", None) == GROUP_FLOW and record.levelno < 30:  # a group's begin/end lines
            return False
        if record.exc_info and isinstance(record.exc_info[1], InputError):  # the CLI says it in one line, exit 2
            return False
        return getattr(record, "hyperband_terminal", True)  # the summary: printed by the CLI itself

    def _stream_dropped(self, record) -> None:
        """The event stream's errors (each with a traceback; job.log keeps them)."""
        exc = record.exc_info[1] if record.exc_info else None
        why = f"{type(exc).__name__}: {exc}" if exc is not None else record.getMessage()
        self._once("dropped", record, "the Prefect API's event stream dropped (%s); Prefect's client reconnects and "
                                      "sends its events again", why)

    def _events_lost(self, record) -> None:
        """Prefect's events client gave up reconnecting (its server restarting)."""
        url, reason = (record.args + ("?", "?"))[:2] if isinstance(record.args, tuple) else ("?", "?")
        self._once("lost", record, "the Prefect API's event stream could not reconnect to %s (%s); " + LOST_TASK_RUNS,
                   url, reason)

    def _once(self, kind: str, record, message: str, *args: Any) -> None:
        """One line of the job's for Prefect's own warnings and errors of one ``kind``: once per job process."""
        if kind in self.said or record.levelno < 30:
            return
        self.said.add(kind)
        logging.getLogger("prefect_hyperband").warning(message, *args)


def _stopped(record) -> bool:
    """A task run that ended because the job is stopping (its ``Stopped``, with a traceback): not an error."""
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc).__name__ == "Stopped" or "encountered an exception Stopped:" in record.getMessage()


class _StopsFilter:
    """A worker's terminal (``hyperband worker``): a training its stop ended (``Stopped``) is no error, so Prefect's
    error line and traceback for it are left out there (the Prefect UI keeps them; the worker's last line says what it
    handed back). Its other lines stay: the worker's terminal is where its machine's trainings show."""

    def filter(self, record) -> bool:
        return not (record.name.startswith("prefect.task_runs") and _stopped(record))


def quiet_stops() -> None:
    """``_StopsFilter`` on the console handlers Prefect's logging set up."""
    from prefect.logging.configuration import setup_logging

    setup_logging()  # idempotent: Prefect's handlers exist before the filter goes on them
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(_StopsFilter())


#: the logger of the job's line for log lines Prefect's API did not take (``tasks.prefect_internals.api_log_errors_as_warnings``)
API_LOGS = "prefect_hyperband.api_logs"


def quiet_terminal(live: bool = False) -> None:
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    setup_logging()  # idempotent: Prefect's handlers exist before the filter goes on them
    prefect_internals.api_log_errors_as_warnings(API_LOGS)  # its errors a warning of the job's, not a glued line
    # the root's console handler, and Prefect's internal logger's own (it does not propagate: its services' errors at exit)
    handlers = [*logging.getLogger().handlers, *logging.getLogger(prefect_internals.INTERNAL_LOGGER).handlers]
    terminal = _TerminalFilter(live)  # one for both: a kind of Prefect's lines said once, whichever handler it took
    for handler in handlers:
        if isinstance(handler, (PrefectConsoleHandler, logging.StreamHandler)) and not isinstance(handler, logging.FileHandler):
            for old in [f for f in handler.filters if isinstance(f, _TerminalFilter)]:
                handler.removeFilter(old)
            handler.addFilter(terminal)


def mlflow_link(params, parent_run_id: str) -> str:
    """Where to see the job in MLflow's model-training view (the UI opens its GenAI view unless told otherwise): the
    parent run's page on a tracking server, or the command that serves a local store."""
    return mlflow_store.run_page(mlflow_store.tracking_uri(params.tracking_uri), parent_run_id)


def _label(s: int) -> str:
    """A bracket's line: ``bracket s=3``, or the priors' mode trained first (``--prior-first``)."""
    return "prior's mode at R" if s == PRIOR_BRACKET else f"bracket s={s}"


class LiveDisplay:
    """Trial-rungs done of planned, per bracket and in all; best so far; elapsed. Redrawn 4 times a second
    on stderr, left on screen when the job ends (``transient=False``)."""

    def __init__(self, stream: Any = None) -> None:
        self.console = Console(file=stream or sys.stderr)
        self.progress: Any = None
        self.tasks: dict[int, Any] = {}
        self.total: Any = None
        self.began = time.monotonic()
        self.best = "best so far: -"
        self.failed: dict[int, int] = {}
        self.metric = ""

    def start(self, event: Start) -> None:
        self.metric = event.metric
        self.progress = Progress(
            TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(), console=self.console, transient=False, refresh_per_second=4,
            redirect_stdout=False, redirect_stderr=False,
        )
        asha = event.mode == "asha"
        for s in sorted(event.planned, reverse=True):
            self.tasks[s] = self.progress.add_task(
                _label(s), total=None if asha else event.planned[s], completed=event.done.get(s, 0), note="")
        planned = sum(event.planned.values())
        self.total = self.progress.add_task(
            f"job {event.job_id}"[:22], total=None if asha else planned, completed=sum(event.done.values()),
            note=event.limits if event.limits and self.best.endswith(": -") else self.best)
        self.progress.start()

    def result(self, event: Result) -> None:
        if self.progress is None:
            return
        if event.bracket not in self.tasks:  # ASHA opens brackets as it goes
            self.tasks[event.bracket] = self.progress.add_task(_label(event.bracket), total=None, note="")
        if event.score is None:
            self.failed[event.bracket] = self.failed.get(event.bracket, 0) + 1
        note = f"{self.failed[event.bracket]} failed" if event.bracket in self.failed else ""
        self.progress.update(self.tasks[event.bracket], advance=1, note=note)
        if event.best is not None:
            self.best = f"best {self.metric} {event.best:.4f} ({event.best_trial})"
        self.progress.update(self.total, advance=1, note=self.best)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
