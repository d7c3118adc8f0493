"""PriorBand's sampling policy (Mallik et al., "PriorBand: Practical Hyperparameter Optimization in the Age of Deep
Learning", NeurIPS 2023): each new config of a bracket comes from the user's prior, from the uniform distribution,
or from a local search around the incumbent, in proportions that follow the bracket's first rung.

* A config for a bracket whose first rung is rung r (of the largest bracket: r = 0 at r_min, s_max at R) comes
  from the uniform distribution with probability p_U = 1 / (1 + η^r), from the prior otherwise (the paper's
  geometric decay: the more a bracket's first rung costs, the fewer configs it tries and the more it trusts the
  prior; the cheap, wide brackets recover from a bad prior).
* Once the job has a result at R, has spent one largest bracket's worth of resource, and has a rung with at least
  η results, the prior's share is split between the prior and the incumbent: the top ⌊n/η⌋ configs of the highest
  such rung, weighted K, K-1, ..., 1 by rank, are scored under the prior's density and under the same shape centred
  on the incumbent (the best result so far, at any resource, as NePS takes it); the shares follow the two sums. An
  incumbent draw is a mutation of it (each parameter moved with probability 0.5, a normal of 0.25 on its unit
  interval).

Random draws come from one generator seeded by the job's seed, saved with the sampler, so a resumed job draws on.
With several objectives the first one ranks (the incumbent, the top ⌊n/η⌋).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.promotion import Directions, Score, as_direction, as_score, first, rank, several, sign
from prefect_hyperband.hyperband.sampler import plain
from prefect_hyperband.hyperband.schedule import brackets
from prefect_hyperband.hyperband.space import Space

#: PriorBand's incumbent mutation: each parameter moved with this probability, by a normal of this deviation
MUTATION_RATE, MUTATION_STD = 0.5, 0.25


class PriorBandSampler:
    def __init__(self, space: Space, seed: int, direction: Directions, min_resource: int, max_resource: int,
                 eta: int) -> None:
        sign(direction)
        self.space, self.seed, self.direction = space, seed, direction
        self.min_resource, self.max_resource, self.eta = min_resource, max_resource, eta
        widest = brackets(min_resource, max_resource, eta)[0]  # s = s_max: its rungs are every rung of the job
        self.resources = [r.resource for r in widest.rungs]
        below = [0, *self.resources[:-1]]
        #: resource -> units one result there adds over the rung below (a promoted trial resumes)
        self.step_cost = {r: r - b for r, b in zip(self.resources, below)}
        self.bracket_cost = sum(r.n_configs * self.step_cost[r.resource] for r in widest.rungs)
        self.rng = np.random.default_rng(seed)
        self.observations: dict[int, list[tuple[dict[str, Any], Score]]] = {}
        self.draws: dict[str, int] = {"prior": 0, "uniform": 0, "incumbent": 0}

    # -- the policy ----------------------------------------------------------------------------
    def shares(self, rung: int) -> dict[str, float]:
        """The probabilities of prior, uniform and incumbent for a config whose bracket starts at rung ``rung``."""
        uniform = 1.0 / (1.0 + self.eta ** rung)
        prior = 1.0 - uniform
        split = self._split()
        if split is None:
            return {"prior": prior, "uniform": uniform, "incumbent": 0.0}
        prior_score, incumbent_score = split
        total = prior_score + incumbent_score
        if total <= 0:
            return {"prior": prior, "uniform": uniform, "incumbent": 0.0}
        return {"prior": prior * prior_score / total, "uniform": uniform, "incumbent": prior * incumbent_score / total}

    def ask_at(self, rung: int) -> dict[str, Any]:
        """A new config for a bracket whose first rung is ``rung`` (0: r_min)."""
        shares = self.shares(rung)
        kinds = list(shares)
        kind = kinds[int(self.rng.choice(len(kinds), p=np.array([shares[k] for k in kinds])))]
        self.draws[kind] += 1
        if kind == "prior":
            return priors.sample_prior(self.space, self.rng)
        if kind == "incumbent":
            return priors.mutate(self.space, self.incumbent() or {}, self.rng, MUTATION_RATE, MUTATION_STD)
        return self.space.sample(self.rng)

    def ask(self) -> dict[str, Any]:
        return self.ask_at(0)

    def tell(self, config: Mapping[str, Any], resource: int, score: Score) -> None:
        if isinstance(resource, bool) or not isinstance(resource, int) or resource < 1:
            raise ValueError(f"resource must be an integer >= 1, got {resource!r}")
        self.observations.setdefault(resource, []).append((dict(config), as_score(score)))

    # -- what the policy reads ---------------------------------------------------------------------
    def _ranked(self, told: list[tuple[dict[str, Any], Score]]) -> list[dict[str, Any]]:
        """The configs of ``told`` that have a score, best first by the (first) objective; ties in the order told."""
        scores = {f"{i:06d}": first(v) for i, (_, v) in enumerate(told) if v is not None}
        return [told[int(i)][0] for i in rank(scores, self.direction[0] if several(self.direction) else self.direction)]  # type: ignore[index]

    def incumbent(self) -> dict[str, Any] | None:
        """The best config of every result told, at any resource: NePS's global incumbent (the best row of all
        completed trial-rungs), like the best the job returns (``scheduler.best_of``). Ties: the higher resource."""
        ranked = self._ranked([o for r in sorted(self.observations, reverse=True) for o in self.observations[r]])
        return ranked[0] if ranked else None

    def _split(self) -> tuple[float, float] | None:
        """(prior score, incumbent score) of the top configs, or None while the incumbent is not yet trusted."""
        scored = {r: sum(v is not None for _, v in obs) for r, obs in self.observations.items()}
        spent = sum(n * self.step_cost.get(r, r) for r, n in scored.items())
        enough = [r for r, n in scored.items() if n >= self.eta]
        if not scored.get(self.max_resource) or spent < self.bracket_cost or not enough:
            return None
        top = self._ranked(self.observations[max(enough)])
        k = len(top) // self.eta
        incumbent = self.incumbent()
        assert incumbent is not None
        weights = range(k, 0, -1)
        prior_score = sum(w * priors.prior_density(self.space, c) for w, c in zip(weights, top[:k]))
        incumbent_score = sum(w * priors.incumbent_density(self.space, c, incumbent) for w, c in zip(weights, top[:k]))
        return prior_score, incumbent_score

    # -- persistence -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "priorband", "seed": self.seed,
            "direction": list(self.direction) if several(self.direction) else self.direction,
            "min_resource": self.min_resource, "max_resource": self.max_resource, "eta": self.eta,
            "rng": plain(self.rng.bit_generator.state), "draws": dict(self.draws),
            "observations": {str(r): [{"config": c, "score": v} for c, v in obs] for r, obs in self.observations.items()},
        }

    @classmethod
    def from_json(cls, space: Space, raw: Mapping[str, Any]) -> PriorBandSampler:
        sampler = cls(space, raw["seed"], as_direction(raw["direction"]), raw["min_resource"], raw["max_resource"],
                      raw["eta"])
        sampler.rng.bit_generator.state = copy.deepcopy(dict(raw["rng"]))
        sampler.draws = dict(raw.get("draws") or sampler.draws)
        sampler.observations = {int(r): [(dict(o["config"]), as_score(o["score"])) for o in obs]
                                for r, obs in raw["observations"].items()}
        return sampler


def first_rung(min_resource: int, max_resource: int, eta: int, s: int) -> int:
    """The index, among the largest bracket's rungs, of bracket s's first rung: s_max - s."""
    return len(brackets(min_resource, max_resource, eta)[0].rungs) - 1 - s


__all__ = ["MUTATION_RATE", "MUTATION_STD", "PriorBandSampler", "first_rung"]
