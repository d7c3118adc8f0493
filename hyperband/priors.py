"""The user's priors as distributions over the space, in PriorBand's form (Mallik et al., NeurIPS 2023).

Each numeric parameter lives on the unit interval (its log if ``log``); a belief ``prior`` with ``confidence`` is a
normal around the prior's position truncated to [0, 1], of standard deviation 0.5, 0.25 or 0.125 (low, medium,
high); a categorical prior weighs its choice 2, 4 or 6 against 1 for each other choice. These are NePS's values when
PriorBand was published (``FloatParameter``/``CategoricalParameter.DEFAULT_CONFIDENCE_SCORES``, e.g. at automl/neps
68ed7020, 2024-05); NePS's rewrite of late 2024 widened them (deviation 0.75, 0.5, 0.25; a categorical's choice
holds 0.25, 0.5 or 0.75 of the mass). A parameter with no prior is uniform. The incumbent's distribution is the
same shape centred on the incumbent (a parameter with no prior at medium confidence), and a mutation moves each
parameter with probability ``rate`` (a normal of ``std`` on the unit interval; a categorical to another choice),
as PriorBand's local search does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from prefect_hyperband.hyperband.space import Param, Space

SIGMA = {"low": 0.5, "medium": 0.25, "high": 0.125}
WEIGHT = {"low": 2.0, "medium": 4.0, "high": 6.0}


def to_unit(p: Param, value: Any) -> float:
    low, high = float(p.low), float(p.high)  # type: ignore[arg-type]
    if p.log:
        return (math.log(float(value)) - math.log(low)) / (math.log(high) - math.log(low))
    return (float(value) - low) / (high - low)


def from_unit(p: Param, u: float) -> Any:
    low, high = float(p.low), float(p.high)  # type: ignore[arg-type]
    u = min(max(u, 0.0), 1.0)
    value = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if p.log else low + u * (high - low)
    return int(min(max(round(value), low), high)) if p.type == "int" else float(min(max(value, low), high))


def _truncated_normal(rng: np.random.Generator, centre: float, sigma: float) -> float:
    """A draw of N(centre, sigma) on [0, 1], by rejection (at sigma <= 0.5 at least a third of draws land inside)."""
    while True:
        u = float(rng.normal(centre, sigma))
        if 0.0 <= u <= 1.0:
            return u


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _truncated_pdf(u: float, centre: float, sigma: float) -> float:
    mass = _normal_cdf((1.0 - centre) / sigma) - _normal_cdf(-centre / sigma)
    return math.exp(-0.5 * ((u - centre) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi) * mass)


def sample_near(p: Param, centre: Any, confidence: str, rng: np.random.Generator) -> Any:
    """One value of ``p`` from the belief centred on ``centre`` at ``confidence``."""
    if p.type == "categorical":
        weights = np.array([WEIGHT[confidence] if c == centre else 1.0 for c in p.choices])
        return p.choices[int(rng.choice(len(p.choices), p=weights / weights.sum()))]
    return from_unit(p, _truncated_normal(rng, to_unit(p, centre), SIGMA[confidence]))


def density(p: Param, value: Any, centre: Any, confidence: str) -> float:
    """The belief's density (numeric, on the unit interval) or probability (categorical) at ``value``."""
    if p.type == "categorical":
        total = WEIGHT[confidence] + len(p.choices) - 1
        return (WEIGHT[confidence] if value == centre else 1.0) / total
    return _truncated_pdf(to_unit(p, value), to_unit(p, centre), SIGMA[confidence])


def sample_prior(space: Space, rng: np.random.Generator) -> dict[str, Any]:
    """A config from the user's priors (uniform where a parameter has none)."""
    return {p.name: sample_near(p, p.prior, p.confidence or "medium", rng) if p.prior is not None else p.sample(rng)
            for p in space.params}


def prior_density(space: Space, config: Mapping[str, Any]) -> float:
    """The priors' density at ``config`` (a parameter with no prior contributes its uniform 1)."""
    return math.prod(density(p, config[p.name], p.prior, p.confidence or "medium") for p in space.params
                     if p.prior is not None)


def incumbent_density(space: Space, config: Mapping[str, Any], incumbent: Mapping[str, Any]) -> float:
    """The density at ``config`` of the priors' shape centred on the incumbent."""
    return math.prod(density(p, config[p.name], incumbent[p.name], p.confidence or "medium") for p in space.params)


def mutate(space: Space, config: Mapping[str, Any], rng: np.random.Generator, rate: float = 0.5,
           std: float = 0.25) -> dict[str, Any]:
    """PriorBand's local search around ``config``: each parameter moved with probability ``rate``."""
    out = dict(config)
    for p in space.params:
        if rng.random() >= rate:
            continue
        if p.type == "categorical":
            others = [c for c in p.choices if c != config[p.name]]
            if others:
                out[p.name] = others[int(rng.integers(len(others)))]
        else:
            out[p.name] = from_unit(p, _truncated_normal(rng, to_unit(p, config[p.name]), std))
    return out


def mode(space: Space) -> dict[str, Any]:
    """The priors' mode: each parameter at its prior; one with none at the middle of its range (of its log with
    ``log``), a categorical at its first choice, as NePS's ``sample_prior_first`` takes a parameter's centre."""
    return {p.name: p.prior if p.prior is not None else p.choices[0] if p.type == "categorical" else from_unit(p, 0.5)
            for p in space.params}


def has_priors(space: Space) -> bool:
    return any(p.prior is not None for p in space.params)


__all__ = ["SIGMA", "WEIGHT", "density", "from_unit", "has_priors", "incumbent_density", "mode", "mutate", "prior_density",
           "sample_near", "sample_prior", "to_unit"]
