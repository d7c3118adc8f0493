"""Which hyperparameters mattered (``hyperband.importance``): Optuna's evaluators on one rung's results."""

from __future__ import annotations

import numpy as np
import pytest

from prefect_hyperband.hyperband.importance import MIN_RESULTS, importance
from prefect_hyperband.hyperband.space import parse

SPACE = parse({"lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True},
               "depth": {"type": "int", "low": 1, "high": 10},
               "noise": {"type": "float", "low": 0.0, "high": 1.0}})


def results(n: int, resource: int, rng: np.random.Generator):
    """A loss that depends on lr a lot, on depth a little, on noise not at all."""
    out = []
    for _ in range(n):
        c = SPACE.sample(rng)
        loss = (np.log10(c["lr"]) + 1.5) ** 2 + 0.05 * abs(c["depth"] - 5) + 0.001 * rng.normal()
        out.append((c, resource, float(loss)))
    return out


@pytest.mark.parametrize("method", ["ped-anova", "fanova"])
def test_the_parameter_the_loss_depends_on_ranks_first(method):
    rng = np.random.default_rng(0)
    found = importance(SPACE, results(200, 1, rng) + results(60, 9, rng), "min", ("val_loss",), method)
    assert found is not None and (found.resource, found.results) == (9, 60)
    ranked = found.top("val_loss", 3)
    assert ranked[0][0] == "lr" and ranked[-1][0] == "noise"
    assert sum(found.scores["val_loss"].values()) == pytest.approx(1.0)
    assert found.line().startswith(f"which hyperparameters mattered ({method.upper()}, 60 results at r=9): lr ")
    assert [row["parameter"] for row in found.table()] == [p for p, _ in ranked]


def test_the_highest_rung_with_enough_results_and_none_without_one():
    rng = np.random.default_rng(1)
    found = importance(SPACE, results(40, 1, rng) + results(MIN_RESULTS - 1, 9, rng), "min")
    assert found is not None and found.resource == 1  # r=9 has too few
    assert importance(SPACE, results(MIN_RESULTS - 1, 1, rng), "min") is None
    failed = [(c, r, None) for c, r, _ in results(40, 1, rng)]
    assert importance(SPACE, failed, "min") is None  # failed results are not results


def test_several_objectives_each_get_their_importances():
    rng = np.random.default_rng(2)
    rows = [(c, r, (-loss, c["depth"] * 1.0)) for c, r, loss in results(80, 3, rng)]  # auc-like max, cost min
    found = importance(SPACE, rows, ("max", "min"), ("val_auc", "predict_ms"))
    assert set(found.scores) == {"val_auc", "predict_ms"}
    assert found.top("val_auc", 1)[0][0] == "lr" and found.top("predict_ms", 1)[0][0] == "depth"
    assert "val_auc: lr" in found.line() and "predict_ms: depth" in found.line()
