"""A scheduler's calls, in order, so that a saved state plus its journal is the scheduler at its last call.

Every scheduler here is deterministic given its saved state: the same calls (``next_trial_rung`` handing out the same
trial-rungs, ``report`` told the same results) leave it in the same state, sampler included. So a job keeps its
state as a snapshot (``to_json``, now and then) plus the calls made since (``Journal``, written by the loop,
appended after each result), and ``replay`` makes those calls again on the loaded snapshot. A result costs one appended
record, not a rewrite of everything the job has learnt.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.hyperband.promotion import Score, as_score
from prefect_hyperband.hyperband.scheduler import Scheduler
from prefect_hyperband.hyperband.trial import TrialRung

#: a call as journaled: ["job", trial_id, resource] (next_trial_rung handed it out), ["report", trial_id, resource,
#: score, checkpoint, error] or ["finish"]
Call = list[Any]


class Diverged(ValueError):
    """A journaled call the loaded scheduler does not make again: the journal is not this state's."""


@dataclass
class Journal:
    """The calls that changed the job's scheduler, in order, kept until ``take``: the loop writes each as it makes it
    (``executors.loop``)."""

    calls: list[Call] = field(default_factory=list)

    def handed(self, trial_rung: TrialRung) -> None:
        """``next_trial_rung`` handed out ``trial_rung``."""
        self.calls.append(["job", trial_rung.trial_id, trial_rung.resource])  # "job": the saved format's word

    def reported(self, trial_id: str, resource: int, score: Score, checkpoint: str | None, error: str | None) -> None:
        self.calls.append(["report", trial_id, resource, _plain(as_score(score)), checkpoint, error])

    def finished(self) -> None:
        self.calls.append(["finish"])

    def take(self) -> list[Call]:
        """The calls since the last ``take``."""
        calls, self.calls = self.calls, []
        return calls


def replay(scheduler: Scheduler, calls: Iterable[Call]) -> int:
    """Make ``calls`` again on ``scheduler`` (loaded with its trial-rungs in flight still out); the number made.
    ``Diverged`` at the first that does not apply (the scheduler keeps the calls before it)."""
    made = 0
    with _unbounded(scheduler):
        for call in calls:
            try:
                _make(scheduler, call)
            except Diverged:
                raise
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise Diverged(f"call {made + 1} ({call[0]} {' '.join(map(str, call[1:3]))}): {exc}") from exc
            made += 1
    return made


def _make(scheduler: Scheduler, call: Call) -> None:
    kind = call[0]
    if kind == "job":
        trial_rung = scheduler.next_trial_rung()
        if trial_rung is None or (trial_rung.trial_id, trial_rung.resource) != (call[1], call[2]):
            got = "nothing" if trial_rung is None else f"{trial_rung.trial_id} to r={trial_rung.resource}"
            raise Diverged(f"the journal handed out {call[1]} to r={call[2]}; the state hands out {got}")
    elif kind == "report":
        _, trial_id, resource, score, checkpoint, error = call
        scheduler.report(trial_id, int(resource), as_score(score), checkpoint, error)
    elif kind == "finish":
        scheduler.finish()
    else:
        raise Diverged(f"unknown call {kind!r}")


@contextmanager
def _unbounded(scheduler: Scheduler) -> Iterator[None]:
    """ASHA's stopping rules off while calls are made again: each was allowed when it was first made (a resume
    may bring a tighter ``max_trials``, and the clock of the job is not the clock of the call)."""
    if not hasattr(scheduler, "bounded"):
        yield
        return
    scheduler.bounded = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        scheduler.bounded = True  # type: ignore[attr-defined]


def _plain(score: float | tuple[float, ...] | None) -> float | list[float] | None:
    return list(score) if isinstance(score, tuple) else score


__all__ = ["Call", "Diverged", "Journal", "replay"]
