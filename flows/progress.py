"""Progress of a running job for whoever watches it: a live terminal display (rich), or nothing.

The driver reports three things here: the job starts (its plan, per bracket), a trial-rung ends
(its bracket, score, the best so far), the job ends. Observers are registered by the program that
runs the job (the CLI registers ``LiveDisplay`` when stderr is a terminal); with none registered,
reporting costs a list lookup. The Prefect UI has its own view (the progress artifact, the task runs).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefect_hyperband.hyperband.first import PRIOR_BRACKET


@dataclass(frozen=True)
class Start:
    job_id: str
    mode: str  # "hyperband" or "asha"
    metric: str
    planned: dict[int, int]  # bracket s -> trial-rungs planned (ASHA: an estimate, its brackets grow)
    done: dict[int, int]  # bracket s -> trial-rungs already done (a resume)
    limits: str = ""  # ASHA: its max_trials and time budget, shown beside the job's line until a best is known


@dataclass(frozen=True)
class Result:
    bracket: int
    trial_id: str
    resource: int
    score: float | None  # None: the trial failed
    best: float | None  # best so far, ranked as the job ranks
    best_trial: str | None


class Observer(Protocol):
    def start(self, event: Start) -> None: ...
    def result(self, event: Result) -> None: ...
    def stop(self) -> None: ...


_observers: list[Observer] = []


def attach(observer: Observer) -> None:
    _observers.append(observer)


def detach(observer: Observer) -> None:
    if observer in _observers:
        _observers.remove(observer)


def active() -> bool:
    return bool(_observers)


def start(event: Start) -> None:
    for o in list(_observers):
        o.start(event)


def result(event: Result) -> None:
    for o in list(_observers):
        o.result(event)


def stop() -> None:
    for o in list(_observers):
        o.stop()


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
