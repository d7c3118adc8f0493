"""Several objectives: which results of a rung are best when no single number says so.

A rung's results are ranked by non-dominated sorting, front after front (Deb et al., "A fast and
elitist multiobjective genetic algorithm: NSGA-II", IEEE TEC 2002, the fast non-dominated sort);
inside a front by NSGA-II's crowding distance, largest first, then by trial id. Promoting the top
⌊n_i/η⌋ of that order is NSGA-II's truncation of the last front that does not fit: whole fronts go
up while they fit, and the rest of the places go to the points of the next front in the sparsest
regions, its extremes (infinite distance) first.

Why crowding distance and not MO-ASHA's ε-net (Schmucker et al., 2021): both are parameter-free and
both keep the extremes of the front, but crowding distance is computed per objective on its own
range, so it does not depend on how the objectives are scaled against each other (AUC in [0, 1]
beside latency in ms), and it is the rule of NSGA-II, the baseline users compare with (Optuna's
default multi-objective sampler); the ε-net's Euclidean distances would need the objectives put
on one scale first.

Everything here speaks ids and numbers: a score is a tuple of floats, one per objective, and
``directions`` says of each whether larger (``max``) or smaller (``min``) is better. Failed results
(any value None or NaN) rank last, by id, and are never promoted.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar

Direction = Literal["max", "min"]
Directions = tuple[Direction, ...]
Id = TypeVar("Id", bound=Hashable)


def check(directions: Sequence[str]) -> Directions:
    """The directions as a tuple, each 'max' or 'min'; at least two (one objective is the plain ranking)."""
    if len(directions) < 2:
        raise ValueError(f"several objectives need at least two directions, got {list(directions)}")
    for d in directions:
        if d not in ("max", "min"):
            raise ValueError(f"direction must be 'max' or 'min', got {d!r}")
    return tuple(directions)  # type: ignore[return-value]


def failed(values: Sequence[float | None] | None) -> bool:
    """A failed result: no values, or any of them None or NaN."""
    if values is None or len(values) == 0:
        return True
    return any(v is None or math.isnan(float(v)) for v in values)


def normalised(values: Sequence[float], directions: Sequence[str]) -> tuple[float, ...]:
    """Each value signed so that larger is better, once: every comparison below runs one way."""
    if len(values) != len(directions):
        raise ValueError(f"a result has {len(values)} values for {len(directions)} objectives: {list(values)}")
    return tuple(float(v) if d == "max" else -float(v) for v, d in zip(values, directions))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Normalised ``a`` dominates ``b``: at least as good in every objective, better in one."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def fronts(scores: Mapping[Id, Sequence[float] | None], directions: Sequence[str]) -> list[list[Id]]:
    """The non-dominated fronts of the finite results, best first, each sorted by id (failed left out)."""
    points = {t: normalised(v, directions) for t, v in scores.items() if not failed(v)}  # type: ignore[arg-type]
    ids = sorted(points, key=str)
    beaten_by: dict[Id, int] = {t: 0 for t in ids}
    beats: dict[Id, list[Id]] = {t: [] for t in ids}
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            if dominates(points[a], points[b]):
                beats[a].append(b)
                beaten_by[b] += 1
            elif dominates(points[b], points[a]):
                beats[b].append(a)
                beaten_by[a] += 1
    out: list[list[Id]] = []
    current = [t for t in ids if beaten_by[t] == 0]
    while current:
        out.append(current)
        following: list[Id] = []
        for a in current:
            for b in beats[a]:
                beaten_by[b] -= 1
                if beaten_by[b] == 0:
                    following.append(b)
        current = sorted(following, key=str)
    return out


def crowding(front: Sequence[Id], scores: Mapping[Id, Sequence[float]], directions: Sequence[str]) -> dict[Id, float]:
    """NSGA-II's crowding distance of each point of one front: per objective, the gap between its two
    neighbours over the front's range, summed; the extremes of every objective get infinity."""
    distance: dict[Id, float] = {t: 0.0 for t in front}
    if len(front) <= 2:
        return {t: math.inf for t in front}
    points = {t: normalised(scores[t], directions) for t in front}  # type: ignore[arg-type]
    for m in range(len(directions)):
        ordered = sorted(front, key=lambda t: (points[t][m], str(t)))
        low, high = points[ordered[0]][m], points[ordered[-1]][m]
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        if high == low:
            continue
        for i in range(1, len(ordered) - 1):
            distance[ordered[i]] += (points[ordered[i + 1]][m] - points[ordered[i - 1]][m]) / (high - low)
    return distance


def rank(scores: Mapping[Id, Sequence[float] | None], directions: Sequence[str]) -> list[Id]:
    """Trial ids best first: front by front; inside a front by crowding distance, largest first, then by id;
    failed results last, by id."""
    out: list[Id] = []
    for front in fronts(scores, directions):
        distance = crowding(front, scores, directions)  # type: ignore[arg-type]
        out += sorted(front, key=lambda t: (-distance[t], str(t)))
    return out + sorted((t for t in scores if failed(scores[t])), key=str)


def front_ranks(scores: Mapping[Id, Sequence[float] | None], directions: Sequence[str]) -> dict[Id, int]:
    """Each finite result's front, 0 for the Pareto front (failed results have none)."""
    return {t: i for i, front in enumerate(fronts(scores, directions)) for t in front}


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float], directions: Sequence[str]) -> float:
    """The volume the points dominate up to ``reference`` (a point worse than every one of interest in every
    objective, in the objectives' own units), by slicing along the last objective (exact; fine for fronts of
    tens of points). Points not better than the reference in every objective add nothing."""
    ref = [-r for r in normalised(reference, directions)]  # minimise from here: smaller is better
    pts = [tuple(-x for x in normalised(p, directions)) for p in points if not failed(p)]
    return _volume([p for p in pts if all(x < r for x, r in zip(p, ref))], ref)


def _volume(points: list[tuple[float, ...]], ref: Sequence[float]) -> float:
    if not points:
        return 0.0
    if len(ref) == 1:
        return ref[0] - min(p[0] for p in points)
    if len(ref) == 2:
        total, ceiling = 0.0, ref[1]
        for x, y in sorted(points):
            if y < ceiling:
                total += (ref[0] - x) * (ceiling - y)
                ceiling = y
        return total
    ordered = sorted(points, key=lambda p: p[-1])
    total = 0.0
    for i, p in enumerate(ordered):
        top = ordered[i + 1][-1] if i + 1 < len(ordered) else ref[-1]
        if top > p[-1]:
            total += _volume([q[:-1] for q in ordered[: i + 1]], ref[:-1]) * (top - p[-1])
    return total


def knee(front: Mapping[Id, Sequence[float]], directions: Sequence[str]) -> Id | None:
    """The front's knee: the point nearest the ideal point once each objective is scaled to [0, 1] over the front
    (the compromise of Deb & Gupta, 2011, in its simplest form); ties by id."""
    if not front:
        return None
    points = {t: normalised(v, directions) for t, v in front.items()}
    dims = range(len(directions))
    low = [min(p[m] for p in points.values()) for m in dims]
    high = [max(p[m] for p in points.values()) for m in dims]

    def gap(t: Id) -> float:
        return math.fsum(((high[m] - points[t][m]) / (high[m] - low[m])) ** 2 for m in dims if high[m] > low[m])

    return min(points, key=lambda t: (gap(t), str(t)))


__all__ = ["Directions", "check", "crowding", "dominates", "failed", "front_ranks", "fronts", "hypervolume", "knee",
           "normalised", "rank"]
