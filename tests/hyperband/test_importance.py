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


@pytest.mark.parametrize("method", ["ped-anova", "fanova"])
def test_on_the_synthetic_model_x_and_y_matter_and_a_parameter_it_ignores_ranks_last_on_five_seeds(method):
    """The synthetic model's closed form (``SyntheticTrainer.curve``) depends on x and y; a third parameter of the
    space, which the trainer never sees (a user's trainer that ignores it), ranks last on every seed."""
    from prefect_hyperband.trainers.synthetic_trainer import SyntheticTrainer

    space = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0},
                   "unused": {"type": "float", "low": 0.0, "high": 1.0}})
    for seed in range(5):
        trainer, rng = SyntheticTrainer(seed=seed), np.random.default_rng(seed)
        configs = [space.sample(rng) for _ in range(80)]
        rows = [(c, 9, trainer.curve({"x": c["x"], "y": c["y"]}, 9)) for c in configs]
        found = importance(space, rows, "min", ("val_loss",), method, seed)
        shares = found.scores["val_loss"]
        assert min(shares, key=shares.get) == "unused", (seed, shares)
        assert shares["x"] > 0.1 and shares["y"] > 0.1, (seed, shares)
