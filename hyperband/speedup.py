"""The arithmetic of a scaling study (``hyperband scale``): one tuning job per cluster size N, compared.

AWS's SageMaker Hyperband post ends with: "repeat the tuning job with multiple cluster configurations
and compare the results to find the optimal hyperparameters that satisfy speed and model accuracy".
Per N: the score tuned at N, the score of the configuration tuned at the smallest N trained unchanged at
N ("transferred": the naive move the post warns about), worker-seconds, wall seconds, and the time until
the job's best-so-far first reached a target. Plain Python: no Prefect, MLflow or trainer imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from prefect_hyperband.hyperband.first import is_baseline

Direction = Literal["min", "max"]


@dataclass(frozen=True)
class ScaleRow:
    workers: int
    tuned_score: float | None
    transferred_score: float | None
    worker_seconds: float
    wall_seconds: float
    time_to_target: float | None  # None: the job never reached the target

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def better(a: float, b: float, direction: Direction) -> bool:
    return a > b if direction == "max" else a < b


def default_target(tuned_at_smallest: float | None, direction: Direction, margin: float = 0.01) -> float | None:
    """The tuned score at the smallest N, relaxed by ``margin`` (minus for maximize, plus for minimize)."""
    if tuned_at_smallest is None:
        return None
    return tuned_at_smallest - margin if direction == "max" else tuned_at_smallest + margin


def time_to_target(rows: Iterable[Mapping[str, Any]], target: float | None, direction: Direction) -> float | None:
    """Seconds from the job's first trial-rung start until its best-so-far first reached ``target``.

    ``rows`` are trial-rungs with ``started``/``ended`` (epoch seconds) and ``score`` (None: failed); the baseline's
    (the default config's, ``hyperband.first.Firsts``) is not the search's and is left out."""
    rows = [r for r in rows if r.get("started") is not None and r.get("ended") is not None
            and not is_baseline(r.get("bracket", 0))]
    if target is None or not rows:
        return None
    t0 = min(float(r["started"]) for r in rows)
    for r in sorted(rows, key=lambda r: float(r["ended"])):
        score = r.get("score")
        if score is not None and (score == target or better(float(score), target, direction)):
            return float(r["ended"]) - t0
    return None


def choose(rows: Sequence[ScaleRow], direction: Direction, tolerance: float) -> tuple[int | None, int | None]:
    """(cheapest, fastest) N among the sizes whose tuned score is within ``tolerance`` of the best tuned score:
    the fewest worker-seconds, and the fewest wall seconds."""
    scored = [r for r in rows if r.tuned_score is not None]
    if not scored:
        return None, None
    best = max(r.tuned_score for r in scored) if direction == "max" else min(r.tuned_score for r in scored)  # type: ignore[type-var]
    good = [r for r in scored if abs(r.tuned_score - best) <= tolerance]  # type: ignore[operator]
    cheapest = min(good, key=lambda r: (r.worker_seconds, r.workers))
    fastest = min(good, key=lambda r: (r.wall_seconds, r.workers))
    return cheapest.workers, fastest.workers


def table(rows: Sequence[ScaleRow], metric: str, cheapest: int | None, fastest: int | None, tolerance: float,
          target: float | None) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    header = ["workers", f"tuned {metric}", f"transferred {metric}", "worker-seconds", "wall seconds", "time to target s"]
    body = [[str(r.workers), num(r.tuned_score, ".4f"), num(r.transferred_score, ".4f"), num(r.worker_seconds, ",.1f"),
             num(r.wall_seconds, ",.1f"), num(r.time_to_target, ",.1f")] for r in rows]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"target {num(target, '.4f')}; within {tolerance:g} of the best tuned {metric}: "
                 f"cheapest {cheapest if cheapest is not None else '-'} workers, "
                 f"fastest {fastest if fastest is not None else '-'} workers")
    return "\n".join(lines)
