"""A synchronous successive-halving bracket as explicit, JSON-serialisable state.

The bracket speaks trial ids and numbers only: the caller trains the trials of ``pending()``
to ``current.resource``, reports each with ``record``, then calls ``advance`` to promote the
top ⌊n_i/η⌋ to the next rung.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefect_hyperband.hyperband.promotion import Directions, Score, as_direction, as_score, failed, promote
from prefect_hyperband.hyperband.schedule import Bracket, Rung
from prefect_hyperband.hyperband.space import Space
from prefect_hyperband.hyperband.trial import Trial, rung_scores
from prefect_hyperband.hyperband.trial import trial_id as make_trial_id


@dataclass
class BracketState:
    s: int
    eta: int
    rungs: tuple[Rung, ...]
    direction: Directions
    trials: dict[str, Trial]
    rung_index: int = 0
    active: list[str] = field(default_factory=list)  # trial ids in the current rung
    #: rung k -> trial id -> its score there (None: failed), in record order
    results: list[dict[str, Score]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results = self.results or [{} for _ in self.rungs]

    @classmethod
    def start(
        cls, bracket: Bracket, eta: int, space: Space, seed: int, direction: Directions,
        ask: Callable[[], dict[str, Any]] | None = None,
    ) -> BracketState:
        """The bracket's n configs: from ``ask`` (a model-based sampler) or from a generator seeded by
        (seed, s), so the same seed gives the same configs whatever order brackets run in."""
        rng = np.random.default_rng([seed, bracket.s])
        trials = {}
        for j in range(bracket.n_configs):
            trial_id = make_trial_id(bracket.s, j)
            trials[trial_id] = Trial(trial_id, bracket.s, dict(ask()) if ask else space.sample(rng))
        return cls(bracket.s, eta, bracket.rungs, direction, trials, 0, list(trials))

    @property
    def current(self) -> Rung:
        return self.rungs[self.rung_index]

    @property
    def done(self) -> bool:
        return self.rung_index >= len(self.rungs)

    def pending(self) -> list[str]:
        """Active trials whose result at the current rung is not yet recorded."""
        return [t for t in self.active if self.trials[t].in_flight]

    def record(self, trial_id: str, resource: int, score: Score, checkpoint: str | None, error: str | None = None) -> None:
        """A trial's result at the current rung; ``score=None`` marks it failed."""
        trial = self.trials[trial_id]
        if trial_id not in self.active or resource != self.current.resource:
            raise ValueError(f"{trial_id} is not training to {resource} in rung {self.rung_index} of bracket {self.s}")
        lost = failed(score)
        self.results[self.rung_index][trial_id] = as_score(score)
        trial.in_flight = False
        if lost:
            trial.status, trial.error = "failed", error or "failed"
        else:
            trial.resource, trial.checkpoint = resource, checkpoint

    def advance(self) -> list[str]:
        """Close the current rung: promote the top ⌊n_i/η⌋ and stop the rest. Returns the promoted ids."""
        if self.pending():
            raise ValueError(f"rung {self.rung_index} of bracket {self.s} still waits for {self.pending()}")
        scores = {t: self.results[self.rung_index].get(t) for t in self.active}
        last = self.rung_index == len(self.rungs) - 1
        if last:
            for t in self.active:
                if self.trials[t].status == "running":
                    self.trials[t].status = "completed"
            self.rung_index += 1
            self.active = []
            return []
        up = promote(scores, self.rungs[self.rung_index + 1].n_configs, self.direction)  # ⌊n_i/η⌋ of the plan
        for t in self.active:
            if t not in up and self.trials[t].status == "running":
                self.trials[t].status = "stopped"
        self.rung_index += 1
        self.active = up
        for t in up:
            self.trials[t].rung, self.trials[t].in_flight = self.rung_index, True
        return up

    def scores(self, trial_id: str) -> dict[int, Score]:
        """One trial's results: resource -> score (None: failed), rung by rung."""
        return rung_scores(self.trials[trial_id], self.results, self.rungs)

    def to_json(self) -> dict[str, Any]:
        return {
            "s": self.s,
            "eta": self.eta,
            "rungs": [dict(vars(r)) for r in self.rungs],  # not ``asdict``: it recurses, and this runs per result
            "direction": self.direction,
            "rung_index": self.rung_index,
            "active": list(self.active),
            # a shallow copy of each trial (``asdict`` deep-copies: a tenth of a job's driver time was spent here)
            "trials": {t: dict(vars(v)) for t, v in self.trials.items()},
            "results": [dict(r) for r in self.results],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BracketState:
        rungs = tuple(Rung(**r) for r in raw["rungs"])
        if "results" not in raw:  # saved before a trial was one type in both modes (3a92ac2)
            raw = _from_trial_scores(raw, rungs)
        return cls(
            raw["s"], raw["eta"], rungs, as_direction(raw["direction"]), {t: Trial(**v) for t, v in raw["trials"].items()},
            raw["rung_index"], list(raw["active"]), [{t: as_score(v) for t, v in r.items()} for r in raw["results"]],
        )


def _from_trial_scores(raw: dict[str, Any], rungs: tuple[Rung, ...]) -> dict[str, Any]:
    """A bracket saved with each trial's scores on the trial (resource -> score) and its ``rung`` the highest
    recorded (-1: none), as the bracket's results rung by rung and each trial at its latest trial-rung."""
    k_of = {r.resource: k for k, r in enumerate(rungs)}
    results: list[dict[str, Any]] = [{} for _ in rungs]
    trials = {}
    for t, v in raw["trials"].items():
        v = dict(v)
        for resource, score in v.pop("scores").items():
            results[k_of[int(resource)]][t] = score
        waiting = t in raw["active"] and v["rung"] < raw["rung_index"]
        v["rung"], v["in_flight"] = (raw["rung_index"], True) if waiting else (max(v["rung"], 0), False)
        trials[t] = v
    return {**raw, "trials": trials, "results": results}
