"""A synthetic model with closed-form learning curves: for demos, tests and timing the orchestrator itself.

A config is a point (x, y) in [0, 1]². Its validation loss after r resource units is

    loss(config, r) = (q(x, y) + a(x, y) · r^(−b(x, y))) · exp(noise · ε),   ε ~ N(0, 1)

* q, the loss it converges to, is the Branin function on its usual domain
  (x1 = 15x − 5, x2 = 15y) shifted to 0 at its three global minima (``OPTIMA``) and divided
  by 310, so q ∈ [0, 1).
* a·r^(−b) is the part still to learn: a and b vary smoothly with the config, so some configs
  that start well end worse and learning curves cross (what makes early stopping fallible).
* ε is drawn from a generator seeded by (seed, config, r): a pure function, so resuming from
  a checkpoint gives exactly what training at once gives, and runs repeat under one seed.

"Training" is instant; ``seconds_per_unit`` sleeps that long per unit trained to emulate cost.
``fail_rate`` makes a deterministic (seeded) share of configs raise ``RuntimeError`` in ``train``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.common.files import write_json_atomic
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.base import TrainResult, write_sidecar

DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "x": {"type": "float", "low": 0.0, "high": 1.0},
    "y": {"type": "float", "low": 0.0, "high": 1.0},
}
#: the centre of the square: q ≈ 0.07, a mediocre default for the tuned config to beat
DEFAULT_CONFIG: dict[str, Any] = {"x": 0.5, "y": 0.5}
PARAMS = frozenset({"x", "y"})

BRANIN_MIN = 0.397887357729738
SCALE = 310.0
#: the three global minima of q (q = 0 there), in config coordinates
OPTIMA: tuple[tuple[float, float], ...] = (
    ((-math.pi + 5) / 15, 12.275 / 15),
    ((math.pi + 5) / 15, 2.275 / 15),
    ((9.42478 + 5) / 15, 2.475 / 15),
)


def branin(x1: float, x2: float) -> float:
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def final_loss(x: float, y: float) -> float:
    """q(x, y): the loss a config converges to, 0 at ``OPTIMA``, below 1 everywhere."""
    return max(0.0, branin(15 * x - 5, 15 * y) - BRANIN_MIN) / SCALE


def decay(x: float, y: float) -> tuple[float, float]:
    """(a, b) of the a·r^(−b) term: a in [0.05, 0.65], b in [0.3, 1.5]."""
    a = 0.35 + 0.3 * math.sin(2 * math.pi * (x + 0.5 * y))
    b = 0.9 + 0.6 * math.cos(math.pi * (1.5 * y - x))
    return a, b


def config_key(config: Mapping[str, Any]) -> int:
    """A stable 63-bit integer for a config (independent of Python's hash seed)."""
    text = json.dumps({k: config[k] for k in sorted(config)}, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


class SyntheticTrainer:
    """``train(config, resource, checkpoint, out)`` on a closed-form learning curve; checkpoints are tiny JSON files."""

    model = "synthetic"
    metric = "loss"
    direction = "min"

    def __init__(
        self,
        seed: int = 0,
        seconds_per_unit: float = 0.0,
        workers: int = 1,
        fail_rate: float = 0.0,
        noise: float = 0.02,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InputError(f"seed must be an integer >= 0, got {seed!r}")
        if not (isinstance(seconds_per_unit, (int, float)) and seconds_per_unit >= 0):
            raise InputError(f"seconds_per_unit must be a number >= 0, got {seconds_per_unit!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InputError(f"workers must be an integer >= 1, got {workers!r}")
        if not (isinstance(fail_rate, (int, float)) and 0.0 <= fail_rate <= 1.0):
            raise InputError(f"fail_rate must be in [0, 1], got {fail_rate!r}")
        if not (isinstance(noise, (int, float)) and noise >= 0):
            raise InputError(f"noise must be a number >= 0, got {noise!r}")
        self.seed, self.seconds_per_unit, self.workers = seed, float(seconds_per_unit), workers
        self.fail_rate, self.noise = float(fail_rate), float(noise)

    # -- the curve ----------------------------------------------------------------------------
    def resolve(self, config: Mapping[str, Any]) -> dict[str, float]:
        """The config with defaults filled in, checked against ``PARAMS`` and [0, 1]."""
        unknown = set(config) - PARAMS
        if unknown:
            raise InputError(f"unknown synthetic parameter(s): {', '.join(sorted(unknown))}; known: x, y")
        resolved = {**DEFAULT_CONFIG, **config}
        for name in sorted(PARAMS):
            value = resolved[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be a number in [0, 1], got {value!r}")
        return {name: float(resolved[name]) for name in sorted(PARAMS)}

    def curve(self, config: Mapping[str, Any], resource: int) -> float:
        """loss(config, resource), noise included: a pure function of (seed, config, resource)."""
        if isinstance(resource, bool) or not isinstance(resource, int) or resource < 1:
            raise ValueError(f"resource must be an integer >= 1, got {resource!r}")
        c = self.resolve(config)
        a, b = decay(c["x"], c["y"])
        mean = final_loss(c["x"], c["y"]) + a * resource ** (-b)
        eps = np.random.default_rng([self.seed, config_key(c), resource]).standard_normal()
        return float(mean * math.exp(self.noise * eps))

    def fails(self, config: Mapping[str, Any]) -> bool:
        """Whether ``train`` raises for this config: a seeded, per-config draw below ``fail_rate``."""
        if self.fail_rate <= 0.0:
            return False
        u = np.random.default_rng([self.seed, config_key(self.resolve(config)), 1]).random(2)[1]
        return bool(u < self.fail_rate)

    # -- the Trainer protocol -----------------------------------------------------------------
    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str) -> TrainResult:
        """Train ``config`` to ``resource`` units from ``checkpoint`` (same config, fewer units) or from zero."""
        began = time.perf_counter()
        resolved = self.resolve(config)
        start = 0
        if checkpoint:
            held = _read(checkpoint)
            start = int(held["resource"])
            if held["config"] != resolved:
                raise ValueError(f"checkpoint {checkpoint} holds config {held['config']}, not {resolved}")
        if isinstance(resource, bool) or not isinstance(resource, int) or resource <= start:
            raise ValueError(f"resource {resource!r} must be an integer exceeding the checkpoint's {start}")
        if self.fails(resolved):
            raise RuntimeError(f"synthetic failure of config {resolved} (fail_rate={self.fail_rate})")
        if self.seconds_per_unit:
            stopping.sleep(self.seconds_per_unit * (resource - start))  # ends early when the job stops
        history = [{"step": float(u), "val_loss": self.curve(resolved, u)} for u in range(start + 1, resource + 1)]
        write_json_atomic(out, {"resource": resource, "config": resolved})
        write_sidecar(out, resource)
        return TrainResult(out, resource, resource - start, time.perf_counter() - began, self.workers, history)

    def measure(self, checkpoint: str, model: Any = None) -> tuple[float, dict[str, float]]:
        """The loss at the checkpoint's resource (nothing else measured)."""
        held = _read(checkpoint)
        return self.curve(held["config"], int(held["resource"])), {}

    def evaluate(self, checkpoint: str) -> float:
        """``measure``'s value alone."""
        return self.measure(checkpoint)[0]

    def close(self) -> None:
        """Nothing to release."""


def _read(checkpoint: str) -> dict[str, Any]:
    path = Path(checkpoint)
    if not path.is_file():
        raise ValueError(f"checkpoint {checkpoint} not found")
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or "resource" not in raw or "config" not in raw:
        raise ValueError(f"checkpoint {checkpoint} is not a synthetic checkpoint (needs resource and config)")
    return raw


__all__ = ["DEFAULT_CONFIG", "DEFAULT_SPACE", "OPTIMA", "PARAMS", "SyntheticTrainer", "decay", "final_loss"]
