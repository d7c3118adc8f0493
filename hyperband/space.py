"""Search spaces: ``{name: {type: float|int|categorical, low, high, log, choices}}``, validated once, sampled seeded.

```yaml
eta: {type: float, low: 0.01, high: 0.5, log: true, prior: 0.1, confidence: high}
max_depth: {type: int, low: 2, high: 10}
grow_policy: {type: categorical, choices: [depthwise, lossguide]}
```

A parameter may carry the user's belief: ``prior`` (a value in its range, or one of its choices) and
``confidence`` (low, medium, high; medium when only a prior is given), which ``--sampler priorband`` samples
from (``hyperband.priors``); every other sampler ignores them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

TYPES = ("float", "int", "categorical")
CONFIDENCES = ("low", "medium", "high")


class SpaceError(ValueError):
    """A search space that cannot be sampled; the message names the parameter and the rule."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    prior: Any = None  # the user's belief, a value of the parameter; None: no prior
    confidence: str | None = None  # low, medium or high, with a prior

    def sample(self, rng: np.random.Generator) -> Any:
        if self.type == "categorical":
            return self.choices[int(rng.integers(len(self.choices)))]
        low, high = float(self.low or 0.0), float(self.high or 0.0)  # set for numeric types by parse()
        if self.type == "int":
            if self.log:  # log-uniform over [low - 0.5, high + 0.5], rounded: every integer reachable
                value = math.exp(rng.uniform(math.log(low - 0.5 + 1e-9), math.log(high + 0.5)))
                return int(min(max(round(value), low), high))
            return int(rng.integers(int(low), int(high) + 1))
        if self.log:
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        return float(rng.uniform(low, high))

    def to_dict(self) -> dict[str, Any]:
        belief = {"prior": self.prior, "confidence": self.confidence} if self.prior is not None else {}
        if self.type == "categorical":
            return {"type": "categorical", "choices": list(self.choices), **belief}
        return {"type": self.type, "low": self.low, "high": self.high, "log": self.log, **belief}


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """One config; parameters drawn in declaration order from ``rng``."""
        return {p.name: p.sample(rng) for p in self.params}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {p.name: p.to_dict() for p in self.params}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def parse(raw: Any, known: Iterable[str] | None = None, model: str = "the model") -> Space:
    """Validate a space given as a mapping; ``known`` names the parameters the model accepts."""
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError("search space must be a non-empty mapping of parameter name -> {type: ...}")
    allowed = set(known) if known is not None else None
    return Space(tuple(_param(str(name), spec, allowed, model) for name, spec in raw.items()))


def load(path: str | Path, known: Iterable[str] | None = None, model: str = "the model") -> Space:
    """A space from a YAML file."""
    path = Path(path)
    if not path.is_file():
        raise SpaceError(f"search space file {str(path)!r} not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_keys_loader())
    except UnicodeDecodeError as exc:
        raise SpaceError(f"search space {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        raise SpaceError(f"search space {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    return parse(raw, known, model)


def _unique_keys_loader():
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one silently: a
    parameter written twice would be the second one without a word)."""
    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice (line {line})",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


#: the largest magnitude of an int parameter's bounds: a float holds every integer up to it (the samplers draw ints
#: through floats), and numpy's int64 draws fit
INT_LIMIT = 2**53


def _number(value: Any) -> Any:
    """``value``, or the number a string spells: YAML 1.1 (PyYAML) reads ``1e-5`` (no dot) as a string."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return value
    return value


def _param(name: str, spec: Any, allowed: set[str] | None, model: str) -> Param:
    if allowed is not None and name not in allowed:
        raise SpaceError(f"unknown parameter {name!r} for {model}; known: {', '.join(sorted(allowed))}")
    if not isinstance(spec, Mapping):
        raise SpaceError(f"{name}: expected a mapping like {{type: float, low: 0.1, high: 1}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise SpaceError(f"{name}: type must be one of {', '.join(TYPES)}, got {kind!r}")
    extra = set(spec) - ({"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log"}) - {"prior", "confidence"}
    if extra:
        raise SpaceError(f"{name}: unexpected key(s) {', '.join(sorted(map(str, extra)))} for type {kind}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{name}: categorical needs a non-empty list of choices, got {choices!r}")
        return _belief(Param(name, kind, choices=tuple(choices)), spec)
    low, high, log = _number(spec.get("low")), _number(spec.get("high")), spec.get("log", False)
    for bound, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpaceError(f"{name}: {bound} must be a finite number, got {spec.get(bound)!r}")
        if kind == "int" and int(value) != value:
            raise SpaceError(f"{name}: {bound} of an int parameter must be a whole number, got {value!r}")
        if kind == "int" and abs(value) > INT_LIMIT:
            raise SpaceError(f"{name}: {bound} of an int parameter must be within ±2**53, got {value!r}")
    if not isinstance(log, bool):
        raise SpaceError(f"{name}: log must be true or false, got {log!r}")
    if not low < high:
        raise SpaceError(f"{name}: low must be < high, got low={low}, high={high}")
    if log and low <= 0:
        raise SpaceError(f"{name}: log scale needs low > 0, got low={low}")
    if not math.isfinite(float(high) - float(low)):
        raise SpaceError(f"{name}: high - low must be a finite number, got low={low}, high={high}")
    if kind == "int":
        return _belief(Param(name, kind, int(low), int(high), log), spec)
    return _belief(Param(name, kind, float(low), float(high), log), spec)


def _belief(param: Param, spec: Mapping[str, Any]) -> Param:
    """The parameter with its ``prior`` and ``confidence``, checked: a value it can take, a known confidence."""
    prior, confidence = spec.get("prior"), spec.get("confidence")
    if param.type != "categorical":
        prior = _number(prior)
    if prior is None:
        if confidence is not None:
            raise SpaceError(f"{param.name}: confidence {confidence!r} without a prior; add prior: <value>")
        return param
    if confidence is None:
        confidence = "medium"
    if confidence not in CONFIDENCES:
        raise SpaceError(f"{param.name}: confidence must be one of {', '.join(CONFIDENCES)}, got {confidence!r}")
    if param.type == "categorical":
        if prior not in param.choices:
            raise SpaceError(f"{param.name}: prior {prior!r} is not one of the choices {list(param.choices)}")
    else:
        numeric = not isinstance(prior, bool) and isinstance(prior, (int, float)) and math.isfinite(prior)
        if not numeric or not (param.low <= prior <= param.high):  # type: ignore[operator]
            raise SpaceError(f"{param.name}: prior must be a number in [{param.low}, {param.high}], got {prior!r}")
        if param.type == "int" and int(prior) != prior:
            raise SpaceError(f"{param.name}: prior of an int parameter must be a whole number, got {prior!r}")
        prior = int(prior) if param.type == "int" else float(prior)
    return replace(param, prior=prior, confidence=confidence)
