"""Config samplers: seeded random draws, BOHB-style TPE on the largest resource with enough results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.space import parse

LINE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})
MIXED = parse(
    {
        "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
        "depth": {"type": "int", "low": 2, "high": 10},
        "leaves": {"type": "int", "low": 4, "high": 256, "log": True},
        "kind": {"type": "categorical", "choices": ["a", "b", "c"]},
    }
)


def quadratic(config: dict) -> float:
    return (config["x"] - 0.3) ** 2


def drive(sampler, n: int, objective=quadratic, resource: int = 1) -> list[dict]:
    configs = []
    for _ in range(n):
        config = sampler.ask()
        sampler.tell(config, resource, objective(config))
        configs.append(config)
    return configs


def in_space(config: dict) -> bool:
    return (
        1e-4 <= config["lr"] <= 1.0 and isinstance(config["lr"], float)
        and 2 <= config["depth"] <= 10 and type(config["depth"]) is int
        and 4 <= config["leaves"] <= 256 and type(config["leaves"]) is int
        and config["kind"] in ("a", "b", "c")
    )


def mixed_objective(config: dict) -> float:
    return -abs(np.log10(config["lr"]) + 2) - abs(config["depth"] - 6) - (config["kind"] != "b")


# -- determinism ---------------------------------------------------------------------------------------


def test_random_sampler_same_seed_same_sequence() -> None:
    a, b, c = RandomSampler(MIXED, 5), RandomSampler(MIXED, 5), RandomSampler(MIXED, 6)
    seq_a, seq_b, seq_c = ([s.ask() for _ in range(20)] for s in (a, b, c))
    assert seq_a == seq_b != seq_c
    assert all(in_space(cfg) for cfg in seq_a)
    a.tell(seq_a[0], 1, 0.5)  # no-op
    resumed = RandomSampler.from_json(MIXED, json.loads(json.dumps(a.to_json())))
    assert [resumed.ask() for _ in range(5)] == [a.ask() for _ in range(5)]


def test_tpe_same_seed_same_sequence_and_resume() -> None:
    runs = []
    for seed in (3, 3, 4):
        sampler = TPESampler(MIXED, seed, "max")
        runs.append(drive(sampler, 14, mixed_objective))
    assert runs[0] == runs[1] != runs[2]
    assert all(in_space(cfg) for cfg in runs[0])
    sampler = TPESampler(MIXED, 3, "max")
    drive(sampler, 10, mixed_objective)
    resumed = TPESampler.from_json(MIXED, json.loads(json.dumps(sampler.to_json())))
    assert resumed.observations == sampler.observations and resumed.min_observations == 5
    assert drive(resumed, 4, mixed_objective) == drive(sampler, 4, mixed_objective)


def test_tpe_over_choices_that_are_lists_warns_nothing() -> None:
    """Optuna warns that a list is no choice its RDB storage can hold; the studies here live in memory, and the
    warning went to the job's terminal as a raw line (found by a fuzz of the CLI)."""
    import warnings

    space = parse({"x": {"type": "float", "low": 0, "high": 1}, "c": {"type": "categorical", "choices": [[1, 2], [3]]}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        configs = drive(TPESampler(space, 0, "min"), 12, lambda c: c["x"] + len(c["c"]))
    assert {tuple(c["c"]) for c in configs} <= {(1, 2), (3,)}


# -- fallback and the choice of resource -------------------------------------------------------------------


def test_tpe_falls_back_to_random_before_enough_observations() -> None:
    tpe, rnd = TPESampler(MIXED, 8, "max"), RandomSampler(MIXED, 8)
    assert tpe.min_observations == len(MIXED.params) + 1 == 5
    # while fewer than d + 1 = 5 results exist at any resource, TPE draws exactly what random draws
    for i in range(4):
        assert tpe.chosen_resource() is None
        config = tpe.ask()
        assert config == rnd.ask()
        tpe.tell(config, 1 + i % 2, mixed_objective(config))  # spread over two resources: 2 + 2
    assert tpe.chosen_resource() is None
    tpe.tell(rnd.ask(), 1, None)  # failed results do not count
    assert tpe.chosen_resource() is None
    tpe.tell({"lr": 5.0, "depth": 3, "leaves": 8, "kind": "a"}, 1, 0.0)  # outside the space: not fitted
    tpe.tell({"lr": 0.1, "depth": 3}, 1, 0.0)  # missing parameters: not fitted
    assert tpe.chosen_resource() is None and len(tpe.usable(1)) == 2
    for _ in range(2):
        config = rnd.ask()
        tpe.tell(config, 1, mixed_objective(config))
    assert tpe.chosen_resource() is None and len(tpe.usable(1)) == 4
    config = rnd.ask()
    tpe.tell(config, 1, mixed_objective(config))
    assert tpe.chosen_resource() == 1
    assert tpe.ask() != rnd.ask()


def test_tpe_uses_the_largest_resource_with_enough_observations() -> None:
    sampler = TPESampler(LINE, 0, "min", min_observations=15)
    rng = np.random.default_rng(1)
    for x in rng.random(15):  # at r=1 the optimum is near 0.1
        sampler.tell({"x": float(x)}, 1, (x - 0.1) ** 2)
    for x in rng.random(14):  # at r=9 it moved to 0.9, but 14 < 15 results there
        sampler.tell({"x": float(x)}, 9, (x - 0.9) ** 2)
    assert sampler.chosen_resource() == 1
    low = np.median([sampler.ask()["x"] for _ in range(9)])
    sampler.tell({"x": 0.85}, 9, 0.05**2)
    assert sampler.chosen_resource() == 9
    high = np.median([sampler.ask()["x"] for _ in range(9)])
    assert low < 0.4 < 0.6 < high
    for x in rng.random(20):  # more results at a lower resource do not pull it back
        sampler.tell({"x": float(x)}, 3, (x - 0.5) ** 2)
    assert sampler.chosen_resource() == 9


def test_tpe_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="direction"):
        TPESampler(LINE, 0, "up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_observations must be an integer >= 1, got 0"):
        TPESampler(LINE, 0, "min", min_observations=0)
    with pytest.raises(ValueError, match="resource must be an integer >= 1"):
        TPESampler(LINE, 0, "min").tell({"x": 0.1}, 0, 1.0)


# -- it learns ----------------------------------------------------------------------------------------


def test_tpe_beats_random_on_a_quadratic() -> None:
    """Mean |x − 0.3| of proposals 21..40: random ≈ 0.29 (uniform), TPE ≈ 0.12, over fixed seeds."""
    tpe, rnd = [], []
    for seed in (0, 1, 2):
        for sampler, out in ((TPESampler(LINE, seed, "min"), tpe), (RandomSampler(LINE, seed), rnd)):
            xs = np.array([c["x"] for c in drive(sampler, 40)])
            out.append(np.abs(xs[20:] - 0.3).mean())
    assert np.mean(tpe) < 0.6 * np.mean(rnd)
    assert np.mean(tpe) < 0.2
    # direction max on the negated objective learns the same
    sampler = TPESampler(LINE, 0, "max")
    xs = np.array([c["x"] for c in drive(sampler, 40, lambda c: -quadratic(c))])
    assert np.abs(xs[20:] - 0.3).mean() < 0.2
