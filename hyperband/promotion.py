"""Which trials go up a rung: the top ⌊n_i/η⌋ by validation metric (Li et al., JMLR 2018, Alg. 1, top_k)."""

from __future__ import annotations

import math
from typing import Hashable, Literal, Mapping, TypeVar

Direction = Literal["max", "min"]
Id = TypeVar("Id", bound=Hashable)


def sign(direction: Direction) -> int:
    """+1 when larger is better: scores are normalised once, so every comparison runs one way."""
    if direction not in ("max", "min"):
        raise ValueError(f"direction must be 'max' or 'min', got {direction!r}")
    return 1 if direction == "max" else -1


def failed(value: float | None) -> bool:
    """The one rule for a failed result: no score, or NaN."""
    return value is None or math.isnan(float(value))


def sort_key(trial_id: Id, value: float | None, direction: Direction) -> tuple[int, float, str]:
    """Best first: finite scores by normalised value, ties by id; failed (None/NaN) trials last."""
    if failed(value):
        return (1, 0.0, str(trial_id))
    return (0, -sign(direction) * value, str(trial_id))


def rank(scores: Mapping[Id, float | None], direction: Direction) -> list[Id]:
    """Trial ids best first, deterministic under ties and failures."""
    return sorted(scores, key=lambda t: sort_key(t, scores[t], direction))


def promote(scores: Mapping[Id, float | None], k: int, direction: Direction) -> list[Id]:
    """The ``k`` best trials of a rung; a failed trial is never promoted."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    ranked = [t for t in rank(scores, direction) if not failed(scores[t])]
    return ranked[:k]


def n_promoted(n_configs: int, eta: int) -> int:
    """⌊n_i/η⌋: how many of a rung's trials go up."""
    return n_configs // eta


def best(scores: Mapping[Id, float | None], direction: Direction) -> Id | None:
    ranked = promote(scores, 1, direction)
    return ranked[0] if ranked else None


__all__ = ["Direction", "best", "failed", "n_promoted", "promote", "rank", "sign", "sort_key"]
