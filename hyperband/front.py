"""A job's Pareto front: every trial at the highest rung it reached, the champion chosen on it, the hypervolume.

Pure numbers over ``TrialRecord``s (several objectives: each score a tuple, one value per objective).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prefect_hyperband.hyperband import pareto
from prefect_hyperband.hyperband.scheduler import TrialRecord

#: the reference point sits this share of each objective's observed range beyond its worst value
MARGIN = 0.1


@dataclass(frozen=True)
class Point:
    trial_id: str
    resource: int  # the highest rung's resource with a result
    values: tuple[float, ...]
    front: int  # 0: on the Pareto front


def last_results(records: Iterable[TrialRecord]) -> dict[str, tuple[int, tuple[float, ...]]]:
    """Each trial's result at the highest resource it was evaluated at, when that result is finite."""
    out = {}
    for t in records:
        if not t.scores:
            continue
        resource = max(t.scores)
        value = t.scores[resource]
        if not pareto.failed(value):  # type: ignore[arg-type]
            out[t.trial_id] = (resource, tuple(float(v) for v in value))  # type: ignore[union-attr]
    return out


def points(records: Iterable[TrialRecord], directions: Sequence[str]) -> list[Point]:
    """Every trial at its highest rung, with its front (0 first), ordered by front then by ``pareto.rank``."""
    last = last_results(records)
    scores = {t: v for t, (_, v) in last.items()}
    ranks = pareto.front_ranks(scores, directions)
    return [Point(t, last[t][0], last[t][1], ranks[t]) for t in pareto.rank(scores, directions)]


def reference(values: Sequence[Sequence[float]], directions: Sequence[str]) -> tuple[float, ...]:
    """The hypervolume's reference point: each objective's worst observed value, ``MARGIN`` of its range beyond
    (a range of 0 counts as 1), so every observed point adds volume."""
    out = []
    for m, d in enumerate(directions):
        column = [v[m] for v in values]
        low, high = min(column), max(column)
        span = (high - low) or 1.0
        out.append(low - MARGIN * span if d == "max" else high + MARGIN * span)
    return tuple(out)


def hypervolume_curve(results: Sequence[tuple[str, tuple[float, ...] | None]], directions: Sequence[str],
                      ref: Sequence[float]) -> list[float]:
    """The hypervolume after each result, in order: each trial counted at its latest result (a trial promoted to a
    higher rung replaces its lower-rung point, as the front does)."""
    latest: dict[str, tuple[float, ...]] = {}
    curve = []
    for trial_id, value in results:
        if value is not None and not pareto.failed(value):
            latest[trial_id] = tuple(value)
        curve.append(pareto.hypervolume(list(latest.values()), ref, directions))
    return curve


def choose(front: Sequence[Point], directions: Sequence[str], names: Sequence[str],
           select: tuple) -> tuple[Point | None, str]:
    """The champion among the front's points by ``select`` (``flows.objectives.parse_select``): the best first
    objective, the knee, or the best first objective meeting a constraint; and a note when a constraint held for
    none (the best first objective then)."""
    if not front:
        return None, ""
    best_first = min(front, key=lambda p: (-pareto.normalised(p.values, directions)[0], p.trial_id))
    if select[0] == "knee" and len(select) == 1:
        chosen = pareto.knee({p.trial_id: p.values for p in front}, directions)
        return next(p for p in front if p.trial_id == chosen), ""
    if len(select) == 3:
        name, op, bound = select
        m = list(names).index(name)
        meets = [p for p in front if _holds(p.values[m], op, bound)]
        if not meets:
            return best_first, f"no config on the front meets {name}{op}{bound:g}; the best {names[0]} instead"
        return min(meets, key=lambda p: (-pareto.normalised(p.values, directions)[0], p.trial_id)), ""
    return best_first, ""


def table(points: Sequence[Point], names: Sequence[str], directions: Sequence[str], champion: str | None) -> str:
    """The Pareto front as the summary prints it: each config on it at its highest rung, the champion starred."""
    on = sorted((p for p in points if p.front == 0), key=lambda p: (-pareto.normalised(p.values, directions)[0], p.trial_id))
    head = ["", "trial", "r", *(f"{n} ({d})" for n, d in zip(names, directions))]
    rows = [["*" if p.trial_id == champion else "", p.trial_id, str(p.resource), *(f"{v:.6g}" for v in p.values)]
            for p in on]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [head, *rows]]
    return f"Pareto front: {len(on)} configs, each at its highest rung (* the champion)\n" + "\n".join(lines)


def _holds(value: float, op: str, bound: float) -> bool:
    return {"<=": value <= bound, "<": value < bound, ">=": value >= bound, ">": value > bound}[op] and math.isfinite(value)


__all__ = ["MARGIN", "Point", "choose", "hypervolume_curve", "last_results", "points", "reference", "table"]
