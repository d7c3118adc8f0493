"""Which hyperparameters mattered: Optuna's importance evaluators on the job's results at one rung.

Not a method of our own: the results of the highest rung with enough of them (``MIN_RESULTS``; a rung's results
are comparable, results of different rungs are not) become Optuna trials, and Optuna's PED-ANOVA (Watanabe et al.,
IJCAI 2023: the default of its newest releases, fast at any size) or fANOVA (Hutter et al., ICML 2014, on request)
scores each parameter; the scores sum to 1. With several objectives, one score set per objective.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect_hyperband.hyperband.promotion import Directions, Score, failed
from prefect_hyperband.hyperband.sampler import distribution, fits
from prefect_hyperband.hyperband.space import Space

#: the evaluators offered (``--importance``)
METHODS = ("ped-anova", "fanova")
#: results a rung needs before its importances mean something (PED-ANOVA compares its top 10 % with the rest)
MIN_RESULTS = 10


@dataclass
class Importance:
    """The importances of one job: per objective, parameter -> share (summing to 1), best first."""

    method: str
    resource: int  # the rung they were computed at
    results: int  # how many results of that rung
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # objective -> parameter -> importance

    def top(self, objective: str, n: int = 3) -> list[tuple[str, float]]:
        return sorted(self.scores[objective].items(), key=lambda kv: -kv[1])[:n]

    def line(self, n: int = 3) -> str:
        """``which hyperparameters mattered (PED-ANOVA, 27 results at r=9): lr 0.61, depth 0.22, ...``."""
        parts = [f"{name + ': ' if len(self.scores) > 1 else ''}"
                 + ", ".join(f"{p} {v:.2f}" for p, v in self.top(name, n)) for name in self.scores]
        return (f"which hyperparameters mattered ({self.method.upper()}, {self.results} results at r={self.resource}): "
                + "; ".join(parts))

    def table(self) -> list[dict[str, Any]]:
        return [{"objective": name, "parameter": p, "importance": round(v, 6), "rank": i + 1}
                for name in self.scores for i, (p, v) in enumerate(self.top(name, len(self.scores[name])))]


def preload() -> None:
    """Import what ``importance`` needs (Optuna and its evaluators: about 3 s of one core here), so that a job can
    pay for it before its results arrive."""
    importlib.import_module("optuna.importance")


def importance(space: Space, results: Iterable[tuple[Mapping[str, Any], int, Score]], direction: Directions,
               objectives: Sequence[str] = ("score",), method: str = "ped-anova",
               seed: int = 0) -> Importance | None:
    """The importances of ``space``'s parameters from ``results`` (config, resource, score) at the highest rung with
    at least ``MIN_RESULTS`` finished results; None when no rung has enough, or the space has one parameter."""
    import optuna

    if method not in METHODS:
        raise ValueError(f"importance method must be one of {', '.join(METHODS)}, got {method!r}")
    dists = {p.name: distribution(p) for p in space.params}
    if len(dists) < 2:
        return None
    by_rung: dict[int, list[tuple[dict[str, Any], Score]]] = {}
    for config, resource, score in results:
        if failed(score) or not all(k in config and fits(d, config[k]) for k, d in dists.items()):
            continue
        by_rung.setdefault(int(resource), []).append(({k: config[k] for k in dists}, score))
    enough = [r for r, rows in by_rung.items() if len(rows) >= MIN_RESULTS]
    if not enough:
        return None
    resource = max(enough)
    rows = by_rung[resource]
    directions = [direction] if isinstance(direction, str) else list(direction)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize" if d == "max" else "minimize" for d in directions])
    study.add_trials([optuna.trial.create_trial(
        params=config, distributions=dists,
        values=[float(v) for v in (score if isinstance(score, (tuple, list)) else [score])])
        for config, score in rows])
    found = Importance(method, resource, len(rows))
    for i, name in enumerate(objectives[:len(directions)]):
        evaluator = (optuna.importance.PedAnovaImportanceEvaluator() if method == "ped-anova"
                     else optuna.importance.FanovaImportanceEvaluator(seed=seed))
        flip = -1.0 if directions[i] == "max" else 1.0  # PED-ANOVA reads a target as smaller-is-better
        target = (lambda t, i=i, flip=flip: flip * t.values[i]) if len(directions) > 1 else None
        with warnings.catch_warnings():  # experimental-API notes, and PED-ANOVA's "lower is better" (handled above)
            warnings.simplefilter("ignore")
            raw = optuna.importance.get_param_importances(study, evaluator=evaluator, target=target, normalize=True)
        found.scores[name] = {p: (0.0 if math.isnan(v) else float(v)) for p, v in raw.items()}
    return found


__all__ = ["Importance", "METHODS", "MIN_RESULTS", "importance", "preload"]
