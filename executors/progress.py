"""Progress of a running job for whoever watches it, or nobody.

The driver reports three things here: the job starts (its plan, per bracket), a trial-rung ends
(its bracket, score, the best so far), the job ends. Observers are registered by the program that
runs the job (the CLI registers ``app.terminal.LiveDisplay`` when stderr is a terminal); with none
registered, reporting costs a list lookup. The Prefect UI has its own view (the progress artifact,
the task runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
