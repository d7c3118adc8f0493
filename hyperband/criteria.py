"""A job that ends when its goal is met: a target score, patience at R, a cost or a time budget.

The loop (``executors.loop``) asks the job's ``Goal`` before it asks the scheduler for a trial-rung, and stops
handing them out once a criterion holds; those in flight finish and report as usual, and the loop ends when none is
left. Nothing is finished: the trials still waiting in a rung stay as they are in the saved state, so ``--resume``
with a looser criterion (or none) goes on where the job stopped. The criteria are not part of the saved state:
they are the job's parameters (each may change on resume), and what they count (the best at R, the results at R
since it last improved) is counted again from the job's rows, so a resumed job stops where an unbroken one would.

The criteria are SageMaker AMT's and Syne Tune's (``StoppingCriterion``): a target objective value, the best not
improving, a cost (worker-seconds) and a wall-clock budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_hyperband.hyperband.first import BASELINE_TRIAL
from prefect_hyperband.hyperband.promotion import Directions, Score, failed, first, sign


@dataclass(frozen=True)
class Criteria:
    """When the job ends before its schedule does; None: not a criterion of this job."""

    target_score: float | None = None  # a result at least this good (the first objective) ...
    target_resource: int | None = None  # ... at this resource or above (default: R)
    patience: int | None = None  # this many results at R in a row without a new best at R
    max_cost: float | None = None  # worker-seconds spent (trainings and evaluations, and lost ones)
    time_budget: float | None = None  # seconds of the job's wall, across resumes

    def any(self) -> bool:
        return any(v is not None for v in (self.target_score, self.patience, self.max_cost, self.time_budget))


class Goal:
    """The job's criteria (``Criteria``), checked by the loop before it hands out a trial-rung (``met``: then none
    more) and told each result (``see``); ``reason`` says which criterion held, and why.

    ``cost()``: worker-seconds spent so far; ``clock()``: seconds since the job began, across resumes; ``rows``: the
    job's results so far, in order (a resume's), counted as if they had been seen here."""

    def __init__(self, criteria: Criteria, direction: Directions, max_resource: int,
                 cost: Callable[[], float] = lambda: 0.0, clock: Callable[[], float] = lambda: 0.0,
                 rows: Iterable[Mapping[str, Any]] = (), metric: str = "score") -> None:
        self.criteria, self.direction, self.max_resource = criteria, direction, max_resource
        self.cost, self.clock, self.metric = cost, clock, metric
        self.target_resource = criteria.target_resource or max_resource
        self.reason: str | None = None
        self.best_at_r: float | None = None
        self.since_best = 0  # results at R in a row that brought no new best at R
        for row in rows:
            self.see(str(row["trial_id"]), int(row["resource"]), row["score"])

    def met(self) -> bool:
        """Whether a criterion holds (the target and the patience as results came, the cost and the time now)."""
        if self.reason is None:
            self.reason = self._spent()
        return self.reason is not None

    def see(self, trial_id: str, resource: int, score: Score) -> None:
        """A result: the target and the patience are checked as it comes. The default config's (the summary's
        baseline) is no result of the search: not counted."""
        if trial_id != BASELINE_TRIAL:
            self._see(trial_id, resource, score)

    # -- the criteria

    def _see(self, trial_id: str, resource: int, score: Score) -> None:
        """The target and the patience (the cost and the time: ``met``, before each new trial-rung)."""
        if failed(score):
            value = None
        else:
            value = float(first(score))  # type: ignore[arg-type]
        c, better = self.criteria, sign(self.direction)
        if value is not None and c.target_score is not None and resource >= self.target_resource \
                and better * value >= better * c.target_score and self.reason is None:
            self.reason = (f"target score {c.target_score:g} reached: {self.metric} {value:.4g} by trial {trial_id} "
                           f"at r={resource}")
        if resource != self.max_resource:
            return
        if value is not None and (self.best_at_r is None or better * value > better * self.best_at_r):
            self.best_at_r, self.since_best = value, 0
        else:
            self.since_best += 1
        if c.patience is not None and self.since_best >= c.patience and self.reason is None:
            self.reason = (f"patience: {self.since_best} results at R={self.max_resource} in a row brought no new best "
                           f"(best {self.metric} {'n/a' if self.best_at_r is None else f'{self.best_at_r:.4g}'})")

    def _spent(self) -> str | None:
        c = self.criteria
        if c.max_cost is not None and (spent := self.cost()) >= c.max_cost:
            return f"max cost: {spent:,.1f} of {c.max_cost:,.1f} worker-seconds spent"
        if c.time_budget is not None and (elapsed := self.clock()) >= c.time_budget:
            return f"time budget: {elapsed:,.1f} of {c.time_budget:,.1f} s spent"
        return None


__all__ = ["Criteria", "Goal"]
