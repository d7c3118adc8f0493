"""Where new configs come from: ``ask() -> config`` and ``tell(config, resource, score)``.

* ``RandomSampler``: Hyperband's get_hyperparameter_configuration, uniform draws from the
  space (Li et al., JMLR 2018), from one numpy Generator seeded once.
* ``TPESampler``: the BOHB idea (Falkner et al., ICML 2018) with Optuna's TPE as the model.
  Observations are kept per resource r; on ``ask`` the model is fitted on the largest r
  with at least ``min_observations`` results (default: number of parameters + 1, as BOHB's
  N_min = d + 1), so it learns from the most trained results once there are enough of
  them. With too few anywhere it falls back to random draws from its seeded generator.
  Each ask builds a fresh in-memory study from those observations
  (``study.add_trial(create_trial(...))``) and asks it once, seeded from the generator.

Failed results (score ``None`` or NaN) are kept but neither counted nor fitted. Both samplers
serialise to JSON (generator state included) so a resumed job continues the same sequence.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.promotion import Directions, Score, as_direction, as_score, several, sign
from prefect_hyperband.hyperband.space import Param, Space


class RandomSampler:
    """Uniform configs from ``space`` (log-uniform where a parameter says so); ``tell`` is a no-op."""

    def __init__(self, space: Space, seed: int) -> None:
        self.space, self.seed = space, seed
        self.rng = np.random.default_rng(seed)

    def ask(self) -> dict[str, Any]:
        return self.space.sample(self.rng)

    def tell(self, config: Mapping[str, Any], resource: int, score: Score) -> None:
        """Random search learns nothing."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "random", "seed": self.seed, "rng": plain(self.rng.bit_generator.state)}

    @classmethod
    def from_json(cls, space: Space, raw: Mapping[str, Any]) -> RandomSampler:
        sampler = cls(space, raw["seed"])
        sampler.rng.bit_generator.state = copy.deepcopy(dict(raw["rng"]))
        return sampler


class TPESampler:
    """BOHB-style model-based configs: Optuna's TPE fitted on the largest resource with enough results; with several
    objectives, Optuna's multi-objective TPE (MOTPE, Ozaki et al., 2020) on the same results."""

    def __init__(self, space: Space, seed: int, direction: Directions, min_observations: int | None = None) -> None:
        sign(direction)
        if min_observations is not None and (
            isinstance(min_observations, bool) or not isinstance(min_observations, int) or min_observations < 1
        ):
            raise ValueError(f"min_observations must be an integer >= 1, got {min_observations!r}")
        self.space, self.seed, self.direction = space, seed, direction
        self.min_observations = len(space.params) + 1 if min_observations is None else min_observations
        self.rng = np.random.default_rng(seed)
        #: resource -> [(config, score)], in the order told; score None: failed (a tuple: several objectives)
        self.observations: dict[int, list[tuple[dict[str, Any], Score]]] = {}
        self._distributions = {p.name: distribution(p) for p in space.params}

    def tell(self, config: Mapping[str, Any], resource: int, score: Score) -> None:
        """Record a result of ``config`` at ``resource``."""
        if isinstance(resource, bool) or not isinstance(resource, int) or resource < 1:
            raise ValueError(f"resource must be an integer >= 1, got {resource!r}")
        self.observations.setdefault(resource, []).append((dict(config), as_score(score)))

    def usable(self, resource: int) -> list[tuple[dict[str, Any], Score]]:
        """The observations at ``resource`` the model can fit: scored, and inside the space."""
        return [
            (c, v)
            for c, v in self.observations.get(resource, [])
            if v is not None and all(name in c and fits(dist, c[name]) for name, dist in self._distributions.items())
        ]

    def chosen_resource(self) -> int | None:
        """The largest resource with at least ``min_observations`` usable results; None: sample at random."""
        for resource in sorted(self.observations, reverse=True):
            if len(self.usable(resource)) >= self.min_observations:
                return resource
        return None

    def ask(self) -> dict[str, Any]:
        resource = self.chosen_resource()
        if resource is None:  # too few results to fit: the user's priors where the space has them
            return priors.sample_prior(self.space, self.rng) if priors.has_priors(self.space) else self.space.sample(self.rng)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seed = int(self.rng.integers(2**31 - 1))
        names = {"max": "maximize", "min": "minimize"}
        directions = [names[d] for d in self.direction] if several(self.direction) else [names[self.direction]]  # type: ignore[index]
        study = optuna.create_study(
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=0), directions=directions,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental/deprecation notices of optuna internals
            for config, value in self.usable(resource):
                params = {name: config[name] for name in self._distributions}
                values = list(value) if isinstance(value, tuple) else [value]  # type: ignore[list-item]
                study.add_trial(optuna.trial.create_trial(params=params, distributions=self._distributions, values=values))
            trial = study.ask(self._distributions)
        return {p.name: _native(p, trial.params[p.name]) for p in self.space.params}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "tpe",
            "seed": self.seed,
            "direction": list(self.direction) if several(self.direction) else self.direction,
            "min_observations": self.min_observations,
            "rng": plain(self.rng.bit_generator.state),
            "observations": {
                str(r): [{"config": c, "score": v} for c, v in obs] for r, obs in self.observations.items()
            },
        }

    @classmethod
    def from_json(cls, space: Space, raw: Mapping[str, Any]) -> TPESampler:
        sampler = cls(space, raw["seed"], as_direction(raw["direction"]), raw["min_observations"])
        sampler.rng.bit_generator.state = copy.deepcopy(dict(raw["rng"]))
        sampler.observations = {
            int(r): [(dict(o["config"]), as_score(o["score"])) for o in obs] for r, obs in raw["observations"].items()
        }
        return sampler


def distribution(p: Param):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if p.type == "categorical":
        with warnings.catch_warnings():  # a choice that is a list, say: fine in memory, where the studies live; Optuna
            warnings.filterwarnings("ignore", message="Choices for a categorical distribution")  # warns for its RDB
            return CategoricalDistribution(list(p.choices))
    if p.low is None or p.high is None:
        raise ValueError(f"{p.name}: a {p.type} parameter needs low and high")
    if p.type == "int":
        return IntDistribution(int(p.low), int(p.high), log=p.log)
    return FloatDistribution(float(p.low), float(p.high), log=p.log)


def fits(dist: Any, value: Any) -> bool:
    """Whether ``value`` lies in an Optuna distribution (a told config may come from outside the space)."""
    if isinstance(value, bool) and not hasattr(dist, "choices"):
        return False
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def _native(p: Param, value: Any) -> Any:
    """Plain Python values, as ``Space.sample`` gives them."""
    if p.type == "int":
        return int(value)
    if p.type == "float":
        return float(value)
    return value


def plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """A bit generator's state as JSON-able data (PCG64's is ints and strings already)."""
    return {k: plain(v) if isinstance(v, Mapping) else (int(v) if isinstance(v, np.integer) else v) for k, v in state.items()}


__all__ = ["RandomSampler", "TPESampler"]
