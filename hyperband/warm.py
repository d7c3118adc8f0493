"""Warm start: earlier jobs seed a new one, as SageMaker AMT's two kinds of warm start do.

* ``identical`` (SageMaker's ``IDENTICAL_DATA_AND_ALGORITHM``): the same model, data, metric and space. The parents'
  results are the sampler's observations before its first draw (TPE fits them, PriorBand takes its incumbent and
  its prior-versus-incumbent split from them), and a config a parent trained to R is not drawn again. The random
  sampler learns nothing from results: its first configs are the parents' best instead.
* ``transfer`` (SageMaker's ``TRANSFER_LEARNING``): other data, or a changed space. The parents' best configs,
  clipped to the new space, become the first configs the job draws (the first bracket's, or ASHA's first), or,
  with PriorBand, the space's priors where the user gave none.

``WarmSampler`` wraps the job's sampler: it tells it the observations once, hands out the first configs, then
draws from it, skipping what the parents trained to R. It round-trips through JSON with the sampler inside.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.promotion import Directions, Score, best_key, failed
from prefect_hyperband.hyperband.space import Param, Space

#: a result of an earlier job: (config, resource, score)
Result = tuple[dict[str, Any], int, Score]
#: at most this many parent jobs (SageMaker's limit)
MAX_PARENTS = 5
#: draws of the sampler before a config a parent trained to R is taken anyway (a space of few configs)
REDRAWS = 20


def same_space(a: Space, b: Space) -> bool:
    """Whether two spaces hold the same parameters over the same values (priors are beliefs, not the space)."""
    bare = lambda s: {p.name: replace(p, prior=None, confidence=None) for p in s.params}  # noqa: E731
    return bare(a) == bare(b)


def in_common(space: Space, config: Mapping[str, Any]) -> list[str]:
    """The parameters of ``space`` that ``config`` gives a value ``space`` can hold once clipped."""
    return [p.name for p in space.params if p.name in config and _clipped(p, config[p.name]) is not None]


def clip(space: Space, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """``config`` moved into ``space``: a number clipped to its range (an int rounded), a choice kept when the
    space has it; a parameter it lacks (or a choice the space has not) at its prior, else the middle of its range,
    as ``priors.mode``. None when nothing of it fits."""
    if not in_common(space, config):
        return None
    middle = priors.mode(space)
    out = {}
    for p in space.params:
        value = _clipped(p, config[p.name]) if p.name in config else None
        out[p.name] = middle[p.name] if value is None else value
    return out


def _clipped(p: Param, value: Any) -> Any:
    if p.type == "categorical":
        return value if value in p.choices else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, high = float(p.low), float(p.high)  # type: ignore[arg-type]
    clipped = min(max(float(value), low), high)
    return int(round(clipped)) if p.type == "int" else clipped


def best_configs(results: Iterable[Result], direction: Directions, k: int) -> list[dict[str, Any]]:
    """The ``k`` best distinct configs of ``results``: those that reached the highest resource first, best first
    there (as the top of the highest rung), then the next resource down; failed ones never."""
    top: dict[str, tuple[int, dict[str, Any], Score]] = {}  # config key -> (its highest resource, config, score)
    for config, resource, score in results:
        key = config_key(config)
        if key not in top or resource > top[key][0]:
            top[key] = (resource, config, score)
    ranked = sorted((v for v in top.values() if not failed(v[2])),
                    key=lambda v: (-v[0], best_key(config_key(v[1]), v[0], v[2], direction)))
    return [dict(v[1]) for v in ranked[:k]]


def with_priors(space: Space, config: Mapping[str, Any], confidence: str = "medium") -> tuple[Space, list[str]]:
    """``space`` with ``config``'s values as the priors of the parameters that have none; and those parameters.
    A prior the user gave stays theirs."""
    changed, params = [], []
    for p in space.params:
        if p.prior is None and p.name in config:
            params.append(replace(p, prior=config[p.name], confidence=confidence))
            changed.append(p.name)
        else:
            params.append(p)
    return Space(tuple(params)), changed


def draw_seed(seed: int, parents: Iterable[str]) -> int:
    """The seed a warm job's sampler draws from: its own, apart from a parent's of the same ``seed``."""
    return zlib.crc32(f"{seed}:warm:{','.join(parents)}".encode())


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)


class WarmSampler:
    """The job's sampler, warm: ``first`` configs before any draw, and no draw equal to a config in ``trained``
    (the parents trained it to R) unless ``REDRAWS`` draws in a row are. The parents' results were told to the
    inner sampler when the job began (``start``), so its saved state holds them."""

    def __init__(self, inner: Any, first: list[dict[str, Any]], trained: Iterable[str], parents: list[str],
                 kind: str) -> None:
        self.inner, self.first = inner, [dict(c) for c in first]
        self.trained, self.parents, self.kind = set(trained), list(parents), kind
        self.redrawn = 0

    @classmethod
    def start(cls, inner: Any, results: Iterable[Result], first: list[dict[str, Any]], max_resource: int,
              parents: list[str], kind: str, observe: bool) -> WarmSampler:
        """A new job's: the parents' ``results`` told to ``inner`` (``observe``: same data and space), their
        configs trained to R remembered."""
        results = list(results)
        if observe:
            for config, resource, score in results:
                inner.tell(config, resource, None if failed(score) else score)
        trained = {config_key(c) for c, r, v in results if r >= max_resource and not failed(v)} if observe else ()
        return cls(inner, first, trained, parents, kind)

    def _draw(self, ask: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if self.first:
            return self.first.pop(0)
        config = ask()
        for _ in range(REDRAWS):
            if config_key(config) not in self.trained:
                break
            self.redrawn += 1
            config = ask()
        return config

    def ask(self) -> dict[str, Any]:
        return self._draw(self.inner.ask)

    def ask_at(self, rung: int) -> dict[str, Any]:
        ask_at = getattr(self.inner, "ask_at", None)
        return self._draw((lambda: ask_at(rung)) if ask_at is not None else self.inner.ask)

    def tell(self, config: Mapping[str, Any], resource: int, score: Score) -> None:
        self.inner.tell(config, resource, score)

    def __getattr__(self, name: str) -> Any:  # the inner sampler's own figures (PriorBand's draws, TPE's rung)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "warm", "inner": self.inner.to_json(), "first": self.first, "trained": sorted(self.trained),
                "parents": self.parents, "warm_kind": self.kind, "redrawn": self.redrawn}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], inner: Any) -> WarmSampler:
        sampler = cls(inner, list(raw["first"]), raw["trained"], list(raw["parents"]), raw["warm_kind"])
        sampler.redrawn = int(raw.get("redrawn", 0))
        return sampler


__all__ = ["MAX_PARENTS", "REDRAWS", "Result", "WarmSampler", "best_configs", "clip", "config_key", "draw_seed",
           "in_common", "same_space", "with_priors"]
