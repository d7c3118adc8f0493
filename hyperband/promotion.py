"""Which trials go up a rung: the top ⌊n_i/η⌋ by validation metric (Li et al., JMLR 2018, Alg. 1, top_k).

With several objectives, a score is a tuple of values and ``direction`` a tuple of directions, one per
objective: the ranking is then ``pareto.rank`` (non-dominated fronts, crowding distance inside one), and
everything else (⌊n_i/η⌋, failures last, never promoted) is unchanged. One objective is a plain float and a
plain direction, exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar, Union

from prefect_hyperband.hyperband import pareto

Direction = Literal["max", "min"]
#: one direction, or one per objective (several objectives)
Directions = Union[Direction, tuple[Direction, ...]]
#: a result: the metric, the objectives' values (several objectives), or None (failed)
Score = Union[float, Sequence[float], None]
Id = TypeVar("Id", bound=Hashable)


def several(direction: Directions) -> bool:
    """Whether ``direction`` names several objectives (a tuple of directions, one per objective)."""
    return isinstance(direction, (tuple, list))


def sign(direction: Directions) -> int:
    """+1 when larger is better: scores are normalised once, so every comparison runs one way. Of several
    objectives, the first's (each is checked)."""
    if several(direction):
        return sign(pareto.check(direction)[0])  # type: ignore[arg-type]
    if direction not in ("max", "min"):
        raise ValueError(f"direction must be 'max' or 'min', got {direction!r}")
    return 1 if direction == "max" else -1


def failed(value: Score) -> bool:
    """The one rule for a failed result: no score, or NaN (of several objectives: any value None or NaN)."""
    if isinstance(value, (tuple, list)):
        return pareto.failed(value)
    return value is None or math.isnan(float(value))  # type: ignore[arg-type]


def as_score(value: Score) -> float | tuple[float, ...] | None:
    """A result as the core keeps it: None when failed, else a float (one objective) or a tuple of floats;
    JSON's lists come back as tuples."""
    if failed(value):
        return None
    if isinstance(value, (tuple, list)):
        return tuple(float(v) for v in value)
    return float(value)  # type: ignore[arg-type]


def as_direction(value: Directions | list[str]) -> Directions:
    """A direction as the core keeps it (JSON's list of several back to a tuple), checked."""
    direction = tuple(value) if isinstance(value, (tuple, list)) else value
    sign(direction)  # type: ignore[arg-type]
    return direction  # type: ignore[return-value]


def first(value: Score) -> float | None:
    """The (first) objective's value: the metric the champion and the leaderboard are ranked by by default."""
    if isinstance(value, (tuple, list)):
        return None if pareto.failed(value) else float(value[0])
    return value  # type: ignore[return-value]


def sort_key(trial_id: Id, value: Score, direction: Directions) -> tuple[int, float, str]:
    """Best first: finite scores by normalised value, ties by id; failed (None/NaN) trials last. Of several
    objectives, by the first (the best-of ranking: ``rank`` orders a rung by all of them)."""
    if failed(value):
        return (1, 0.0, str(trial_id))
    return (0, -sign(direction) * first(value), str(trial_id))  # type: ignore[operator]


def best_key(trial_id: str, resource: int, value: Score, direction: Directions) -> tuple[int, float, str]:
    """The one ranking of results across a job (the best so far, the champion, the leaderboard): ``sort_key`` on
    ``trial@resource``, so ties go to the smaller trial id, then to the smaller resource."""
    return sort_key(f"{trial_id}@{resource:06d}", value, direction)


def best_rung(trial_id: str, scores: Mapping[int, Score], direction: Directions) -> tuple[int, float] | None:
    """A trial's best (resource, value of the first objective) over its rungs, ranked as the job's best is
    (``best_key``: ties to the smaller resource); None when no rung has a score."""
    seen = [(r, v) for r, v in scores.items() if not failed(v)]
    if not seen:
        return None
    resource, value = min(seen, key=lambda c: best_key(trial_id, c[0], c[1], direction))
    return resource, first(value)  # type: ignore[return-value]


def rank(scores: Mapping[Id, Score], direction: Directions) -> list[Id]:
    """Trial ids best first, deterministic under ties and failures; by Pareto fronts with several objectives."""
    if several(direction):
        return pareto.rank(scores, pareto.check(direction))  # type: ignore[arg-type]
    return sorted(scores, key=lambda t: sort_key(t, scores[t], direction))


def promote(scores: Mapping[Id, Score], k: int, direction: Directions) -> list[Id]:
    """The ``k`` best trials of a rung; a failed trial is never promoted."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    ranked = [t for t in rank(scores, direction) if not failed(scores[t])]
    return ranked[:k]


def n_promoted(n_configs: int, eta: int) -> int:
    """⌊n_i/η⌋: how many of a rung's trials go up."""
    return n_configs // eta


def best(scores: Mapping[Id, Score], direction: Directions) -> Id | None:
    ranked = promote(scores, 1, direction)
    return ranked[0] if ranked else None


__all__ = ["Direction", "Directions", "Score", "as_direction", "as_score", "best", "best_rung", "failed", "first",
           "n_promoted", "promote", "rank", "several", "sign", "sort_key"]
