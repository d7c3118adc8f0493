"""Asynchronous successive halving (ASHA, Li et al., MLSys 2020, Algorithm 2) over Hyperband's brackets.

No rung ever waits for a full cohort. Whenever a worker is free, ``next_trial_rung`` looks for a trial
in rung k that is among the top ⌊|rung k|/η⌋ results recorded there so far and has not gone
up yet, and promotes it to rung k+1; if there is none, it starts a new config at rung 0.

Brackets. Each bracket s of ``schedule.brackets(r, R, η)`` is one ASHA instance; rung k of
bracket s trains to exactly ``brackets[s].rungs[k].resource`` (⌊R/η^(s−k)⌋, the grid the
synchronous bracket uses, so checkpoints line up and the top rung is R).

Choices the paper leaves open (documented here, tested in ``tests/hyperband/test_asha.py``):

* **Cross-bracket promotion order.** Within a bracket the paper's rule applies: highest
  non-top rung first, best result first. Across brackets the promotion that goes to the
  highest resource wins (finishing trials near R first frees their workers soonest and
  yields results at R early); ties, which occur because all brackets share one resource
  grid, go to the larger s (the more exploratory bracket, which Hyperband runs first).
* **Bracket of a new config.** New configs are dealt to brackets by deterministic weighted
  round-robin with weights n_s = ``rungs[0].n_configs`` (the highest-averages/D'Hondt rule):
  the next config goes to the bracket with the largest n_s / (started_s + 1), ties to the
  larger s. After every Σ n_s new configs each bracket s has received exactly n_s of them,
  Hyperband's proportions (e.g. r=1, R=27, η=3: 27:12:6:4), and every prefix is within one
  config of them from below (lower quota).
* **Failures.** A failed result (score ``None`` or NaN) counts in |rung k| (it is a result
  recorded there) but is never promoted; ``promotion.promote`` skips it.
* **End.** ASHA never closes a rung: a trial waiting in rung k may still be promoted by
  later results. ``finish()`` marks the trials still waiting as stopped once the caller
  starts no more configs and nothing is in flight (``done``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.hyperband.promotion import (
    Directions,
    Score,
    as_direction,
    as_score,
    failed,
    promote,
    several,
    sign,
    sort_key,
)
from prefect_hyperband.hyperband.schedule import Bracket
from prefect_hyperband.hyperband.schedule import brackets as schedule_brackets
from prefect_hyperband.hyperband.trial import Trial, TrialRung, rung_scores
from prefect_hyperband.hyperband.trial import trial_id as make_trial_id


@dataclass
class AshaState:
    """ASHA over the brackets ``brackets`` (s values, largest first) of the (r, R, η) schedule."""

    min_resource: int
    max_resource: int
    eta: int
    direction: Directions
    brackets: tuple[int, ...]
    #: s -> rung k -> trial id -> score recorded at rung k (None: failed), in report order
    rungs: dict[int, list[dict[str, Score]]]
    #: s -> rung k -> trial ids already promoted out of rung k
    promoted: dict[int, list[set[str]]]
    trials: dict[str, Trial]
    #: s -> configs started in bracket s
    started: dict[int, int]
    _plan: dict[int, Bracket] = field(init=False, repr=False, compare=False)
    #: (s, k) -> the sort keys of rung k's results not promoted out of it, and of those promoted (one objective)
    _waiting: dict[tuple[int, int], list[tuple]] = field(init=False, repr=False, compare=False)
    _up: dict[tuple[int, int], list[tuple]] = field(init=False, repr=False, compare=False)
    #: the (s, k) of every rung a trial may leave, in the order promotions are taken
    _order: list[tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sign(self.direction)
        plan = {b.s: b for b in schedule_brackets(self.min_resource, self.max_resource, self.eta)}
        if not self.brackets:
            raise ValueError("brackets must name at least one bracket s")
        for s in self.brackets:
            if s not in plan:
                raise ValueError(f"bracket s={s!r} is not in the schedule: s must be in 0..{max(plan)}")
        if len(set(self.brackets)) != len(self.brackets):
            raise ValueError(f"brackets must not repeat an s, got {list(self.brackets)}")
        self.brackets = tuple(sorted(self.brackets, reverse=True))
        self._plan = {s: plan[s] for s in self.brackets}
        order = [(s, k) for s in self.brackets for k in range(len(self._plan[s].rungs) - 2, -1, -1)]
        self._order = sorted(order, key=lambda c: (-self._plan[c[0]].rungs[c[1] + 1].resource, -c[0]))
        self._waiting, self._up = {}, {}
        if not several(self.direction):  # Pareto ranks are not a sorted list: several objectives rank each time
            for s, k in order:
                results = self.rungs[s][k]
                up = self.promoted[s][k]
                keys = [(sort_key(t, v, self.direction), t) for t, v in results.items() if not failed(v)]
                self._waiting[s, k] = sorted(key for key in keys if key[1] not in up)
                self._up[s, k] = sorted(key for key in keys if key[1] in up)

    @classmethod
    def create(
        cls,
        min_resource: int,
        max_resource: int,
        eta: int,
        direction: Directions = "max",
        brackets: Iterable[int] | None = None,
    ) -> AshaState:
        """An empty run over ``brackets`` (default: every bracket s = s_max..0 of the schedule)."""
        plan = schedule_brackets(min_resource, max_resource, eta)
        chosen = tuple(b.s for b in plan) if brackets is None else tuple(brackets)
        by_s = {b.s: b for b in plan}
        valid = [s for s in chosen if s in by_s]
        return cls(
            min_resource, max_resource, eta, direction, chosen,
            rungs={s: [{} for _ in by_s[s].rungs] for s in valid},
            promoted={s: [set() for _ in by_s[s].rungs] for s in valid},
            trials={},
            started={s: 0 for s in valid},
        )

    # -- queries ------------------------------------------------------------------------------
    def plan(self, s: int) -> Bracket:
        """The synchronous schedule of bracket s: its rung resources are ASHA's rung resources."""
        return self._plan[s]

    @property
    def configs_started(self) -> int:
        """Configs started so far, over all brackets."""
        return sum(self.started.values())

    def in_flight(self) -> list[str]:
        return [t for t, v in self.trials.items() if v.in_flight]

    def promotable(self) -> list[tuple[int, int, str]]:
        """Every (s, k, trial id) that may go from rung k to k+1 now, in the order ``next_trial_rung`` takes them.

        Per bracket, rung k offers the top ⌊|rung k|/η⌋ of its recorded results (best first,
        ties by id, failed never) less those already promoted; across brackets and rungs the
        order is: resource of rung k+1 descending, then s descending.
        """
        found: list[tuple[int, int, str]] = []
        for s in self.brackets:
            rungs = self._plan[s].rungs
            for k in range(len(rungs) - 2, -1, -1):
                results = self.rungs[s][k]
                for t in promote(results, len(results) // self.eta, self.direction):
                    trial = self.trials[t]
                    if t not in self.promoted[s][k] and not trial.in_flight and trial.status == "running":
                        found.append((s, k, t))
        found.sort(key=lambda c: (-self._plan[c[0]].rungs[c[1] + 1].resource, -c[0]))  # stable: rank order kept
        return found

    def next_promotion(self) -> tuple[int, int, str] | None:
        """``promotable()[0]`` without ranking every rung: per rung, its best result not yet promoted goes up when
        fewer than ⌊|rung k|/η⌋ promoted results rank above it (O(log n) a rung; one objective)."""
        if several(self.direction):
            found = self.promotable()
            return found[0] if found else None
        for s, k in self._order:
            waiting = self._waiting[s, k]
            if waiting and bisect_left(self._up[s, k], waiting[0]) < len(self.rungs[s][k]) // self.eta:
                trial_id = waiting[0][1]
                trial = self.trials[trial_id]
                if not trial.in_flight and trial.status == "running":
                    return s, k, trial_id
                found = self.promotable()  # not reached in a run; kept exact for states edited by hand
                return found[0] if found else None
        return None

    def next_bracket(self) -> int:
        """The bracket of the next new config: largest n_s / (started_s + 1), ties to the larger s (D'Hondt)."""
        chosen = self.brackets[0]
        for s in self.brackets[1:]:
            n_s, n_c = self._plan[s].n_configs, self._plan[chosen].n_configs
            if n_s * (self.started[chosen] + 1) > n_c * (self.started[s] + 1):  # exact, in integers
                chosen = s
        return chosen

    def done(self, can_start_new: bool = False) -> bool:
        """Nothing in flight, nothing promotable and no new config allowed: the run cannot move."""
        return not can_start_new and not self.in_flight() and self.next_promotion() is None

    # -- decisions ----------------------------------------------------------------------------
    def next_trial_rung(self, new_config: Callable[[], Mapping[str, Any]], can_start_new: bool) -> TrialRung | None:
        """Algorithm 2's get_job: promote if any trial is promotable, else start ``new_config()`` if allowed.

        The trial of the returned trial-rung is marked in flight until ``report``.
        """
        candidate = self.next_promotion()
        if candidate:
            s, k, trial_id = candidate
            trial = self.trials[trial_id]
            self.promoted[s][k].add(trial_id)
            if (s, k) in self._waiting:
                key = (sort_key(trial_id, self.rungs[s][k][trial_id], self.direction), trial_id)
                waiting = self._waiting[s, k]
                del waiting[bisect_left(waiting, key)]
                insort(self._up[s, k], key)
            trial.rung, trial.in_flight = k + 1, True
            resource = self._plan[s].rungs[k + 1].resource
            return TrialRung(trial_id, s, k + 1, resource, dict(trial.config), trial.checkpoint)
        if not can_start_new:
            return None
        s = self.next_bracket()
        config = new_config()
        if not isinstance(config, Mapping):
            raise ValueError(f"new_config must return a mapping of parameter -> value, got {config!r}")
        trial_id = make_trial_id(s, self.started[s])
        self.started[s] += 1
        self.trials[trial_id] = Trial(trial_id, s, dict(config))
        return TrialRung(trial_id, s, 0, self._plan[s].rungs[0].resource, dict(config), None)

    def report(
        self,
        trial_id: str,
        resource: int,
        score: Score,
        checkpoint: str | None = None,
        error: str | None = None,
    ) -> None:
        """Record the result of an in-flight trial-rung in the rung of ``resource``; ``score=None`` (or NaN) marks a failure."""
        trial = self.trials.get(trial_id)
        if trial is None:
            raise ValueError(f"unknown trial {trial_id!r}")
        if not trial.in_flight:
            raise ValueError(f"trial {trial_id} has no trial-rung in flight; report each once")
        expected = self._plan[trial.bracket].rungs[trial.rung].resource
        if resource != expected:
            raise ValueError(
                f"trial {trial_id} trains to {expected} in rung {trial.rung} of bracket {trial.bracket}, got resource {resource}"
            )
        lost = failed(score)
        self.rungs[trial.bracket][trial.rung][trial_id] = as_score(score)
        trial.in_flight = False
        if not lost and (trial.bracket, trial.rung) in self._waiting:
            value = self.rungs[trial.bracket][trial.rung][trial_id]
            insort(self._waiting[trial.bracket, trial.rung], (sort_key(trial_id, value, self.direction), trial_id))
        if lost:
            trial.status, trial.error = "failed", error or "failed"
            return
        trial.resource, trial.checkpoint = resource, checkpoint
        if trial.rung == len(self._plan[trial.bracket].rungs) - 1:
            trial.status = "completed"

    def finish(self) -> list[str]:
        """At the end of the run: mark the trials still waiting in a rung as stopped; returns their ids."""
        flying = self.in_flight()
        if flying:
            raise ValueError(f"cannot finish with trial-rungs in flight: report {', '.join(flying)} first")
        stopped = [t for t, v in self.trials.items() if v.status == "running"]
        for t in stopped:
            self.trials[t].status = "stopped"
        return stopped

    # -- results ------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every recorded result: trial_id, bracket, rung, resource, score (None: failed)."""
        return [
            {"trial_id": t, "bracket": s, "rung": k, "resource": self._plan[s].rungs[k].resource, "score": value}
            for s in self.brackets
            for k, results in enumerate(self.rungs[s])
            for t, value in results.items()
        ]

    def scores(self, trial_id: str) -> dict[int, Score]:
        """One trial's results: resource -> score (None: failed), rung by rung."""
        t = self.trials[trial_id]
        return rung_scores(t, self.rungs[t.bracket], self._plan[t.bracket].rungs)

    # -- persistence --------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "min_resource": self.min_resource,
            "max_resource": self.max_resource,
            "eta": self.eta,
            "direction": self.direction,
            "brackets": list(self.brackets),
            "rungs": {str(s): [dict(r) for r in rungs] for s, rungs in self.rungs.items()},
            "promoted": {str(s): [sorted(p) for p in rungs] for s, rungs in self.promoted.items()},
            "trials": {t: dict(vars(v)) for t, v in self.trials.items()},  # shallow: asdict deep-copies
            "started": {str(s): n for s, n in self.started.items()},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AshaState:
        return cls(
            raw["min_resource"],
            raw["max_resource"],
            raw["eta"],
            as_direction(raw["direction"]),
            tuple(raw["brackets"]),
            rungs={int(s): [{t: as_score(v) for t, v in r.items()} for r in rungs] for s, rungs in raw["rungs"].items()},
            promoted={int(s): [set(p) for p in rungs] for s, rungs in raw["promoted"].items()},
            trials={t: Trial(**v) for t, v in raw["trials"].items()},
            started={int(s): n for s, n in raw["started"].items()},
        )


__all__ = ["AshaState"]
