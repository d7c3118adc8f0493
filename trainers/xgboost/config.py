"""The XGBoost model's hyperparameters: the default space and configuration, the booster parameters a space may
name, the rounds in one unit of resource, and the segments a trial-rung's rounds are trained in (the trainer's
bit-for-bit resume: ``trainers.xgboost.trainer``)."""

from __future__ import annotations

from typing import Any

#: The six parameters AWS's SageMaker Hyperband example tunes; boosting rounds are the resource.
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "eta": {"type": "float", "low": 0.01, "high": 0.5, "log": True},
    "alpha": {"type": "float", "low": 1e-3, "high": 10.0, "log": True},
    "min_child_weight": {"type": "float", "low": 1.0, "high": 20.0, "log": True},
    "max_depth": {"type": "int", "low": 2, "high": 10},
    "colsample_bylevel": {"type": "float", "low": 0.3, "high": 1.0},
    "colsample_bytree": {"type": "float", "low": 0.3, "high": 1.0},
}
#: XGBoost's own defaults: the "default configuration" the summary compares against.
DEFAULT_CONFIG: dict[str, Any] = {
    "eta": 0.3,
    "alpha": 0.0,
    "min_child_weight": 1.0,
    "max_depth": 6,
    "colsample_bylevel": 1.0,
    "colsample_bytree": 1.0,
}
#: boosting rounds one unit of resource trains, unless the job says otherwise (``--rounds-per-unit``)
ROUNDS_PER_UNIT = 10
#: Booster parameters a search space may name (tree booster, hist method).
PARAMS = frozenset(
    {
        "eta", "learning_rate", "gamma", "min_split_loss", "max_depth", "min_child_weight",
        "max_delta_step", "subsample", "sampling_method", "colsample_bytree", "colsample_bylevel",
        "colsample_bynode", "lambda", "reg_lambda", "alpha", "reg_alpha", "grow_policy",
        "max_leaves", "max_bin", "scale_pos_weight", "num_parallel_tree", "max_cat_to_onehot",
    }
)


def segments(start: int, stop: int, milestones: tuple[int, ...]) -> list[tuple[int, int]]:
    """Split [start, stop) at every milestone strictly inside it."""
    cuts = [start, *sorted(m for m in set(milestones) if start < m < stop), stop]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]
