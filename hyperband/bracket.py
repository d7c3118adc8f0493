"""A synchronous successive-halving bracket as explicit, JSON-serialisable state.

The bracket speaks trial ids and numbers only: the caller trains the trials of ``pending()``
to ``current.resource``, reports each with ``record``, then calls ``advance`` to promote the
top ⌊n_i/η⌋ to the next rung.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from prefect_hyperband.hyperband.promotion import Directions, Score, as_direction, as_score, failed, promote
from prefect_hyperband.hyperband.schedule import Bracket, Rung
from prefect_hyperband.hyperband.space import Space
from prefect_hyperband.hyperband.trial import Status, trial_id as make_trial_id



@dataclass
class Trial:
    """One config's life in a bracket."""

    trial_id: str
    bracket: int
    config: dict[str, Any]
    resource: int = 0  # units held by ``checkpoint``
    checkpoint: str | None = None
    rung: int = -1  # highest rung whose result is recorded
    scores: dict[int, Score] = field(default_factory=dict)  # resource -> metric, or objectives' values (None: failed)
    status: Status = "running"
    error: str | None = None


@dataclass
class BracketState:
    s: int
    eta: int
    rungs: tuple[Rung, ...]
    direction: Directions
    trials: dict[str, Trial]
    rung_index: int = 0
    active: list[str] = field(default_factory=list)  # trial ids in the current rung

    @classmethod
    def start(
        cls, bracket: Bracket, eta: int, space: Space, seed: int, direction: Directions,
        ask: Callable[[], dict[str, Any]] | None = None,
    ) -> "BracketState":
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
        if self.done:
            return []
        return [t for t in self.active if self.trials[t].rung < self.rung_index]

    def record(self, trial_id: str, resource: int, score: Score, checkpoint: str | None, error: str | None = None) -> None:
        """A trial's result at the current rung; ``score=None`` marks it failed."""
        trial = self.trials[trial_id]
        if trial_id not in self.active or resource != self.current.resource:
            raise ValueError(f"{trial_id} is not training to {resource} in rung {self.rung_index} of bracket {self.s}")
        lost = failed(score)
        trial.scores[resource] = as_score(score)
        trial.rung = self.rung_index
        if lost:
            trial.status, trial.error = "failed", error or "failed"
        else:
            trial.resource, trial.checkpoint = resource, checkpoint

    def advance(self) -> list[str]:
        """Close the current rung: promote the top ⌊n_i/η⌋ and stop the rest. Returns the promoted ids."""
        if self.pending():
            raise ValueError(f"rung {self.rung_index} of bracket {self.s} still waits for {self.pending()}")
        scores = {t: self.trials[t].scores.get(self.current.resource) for t in self.active}
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
        return up

    def to_json(self) -> dict[str, Any]:
        return {
            "s": self.s,
            "eta": self.eta,
            "rungs": [dict(vars(r)) for r in self.rungs],  # not ``asdict``: it recurses, and this runs per result
            "direction": self.direction,
            "rung_index": self.rung_index,
            "active": list(self.active),
            # a shallow copy of each trial (``asdict`` deep-copies: a tenth of a job's driver time was spent here)
            "trials": {t: {**vars(v), "scores": {str(k): s for k, s in v.scores.items()}} for t, v in self.trials.items()},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "BracketState":
        trials = {}
        for t, v in raw["trials"].items():
            v = dict(v)
            v["scores"] = {int(k): as_score(s) for k, s in v["scores"].items()}
            trials[t] = Trial(**v)
        return cls(
            raw["s"], raw["eta"], tuple(Rung(**r) for r in raw["rungs"]), as_direction(raw["direction"]), trials,
            raw["rung_index"], list(raw["active"]),
        )
