from __future__ import annotations

import numpy as np
import pytest

from prefect_hyperband.hyperband.space import SpaceError, load, parse

XGB = {"eta", "max_depth", "grow_policy"}


def test_yaml_space_from_the_issue_parses_and_samples_in_range(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "eta: {type: float, low: 0.01, high: 0.5, log: true}\n"
        "max_depth: {type: int, low: 2, high: 10}\n"
        "grow_policy: {type: categorical, choices: [depthwise, lossguide]}\n"
    )
    space = load(path, XGB, "xgboost")
    rng = np.random.default_rng(0)
    configs = [space.sample(rng) for _ in range(200)]
    assert all(0.01 <= c["eta"] <= 0.5 for c in configs)
    assert {c["max_depth"] for c in configs} == set(range(2, 11))
    assert {c["grow_policy"] for c in configs} == {"depthwise", "lossguide"}
    assert all(isinstance(c["max_depth"], int) for c in configs)
    # log scale: about half the draws below the geometric mean sqrt(0.01 * 0.5)
    below = np.mean([c["eta"] < (0.01 * 0.5) ** 0.5 for c in configs])
    assert 0.35 < below < 0.65


def test_same_seed_same_configs():
    space = parse({"x": {"type": "float", "low": 0, "high": 1}, "k": {"type": "int", "low": 1, "high": 100, "log": True}})
    a = [space.sample(np.random.default_rng(7)) for _ in range(3)]
    b = [space.sample(np.random.default_rng(7)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"eta": {"type": "float", "low": 0.5, "high": 0.1}}, "eta: low must be < high, got low=0.5, high=0.1"),
        ({"eta": {"type": "float", "low": 0, "high": 1, "log": True}}, "eta: log scale needs low > 0"),
        ({"eta": {"type": "normal", "low": 0, "high": 1}}, "eta: type must be one of float, int, categorical"),
        ({"colour": {"type": "float", "low": 0, "high": 1}}, "unknown parameter 'colour' for xgboost"),
        ({"grow_policy": {"type": "categorical", "choices": []}}, "grow_policy: categorical needs a non-empty list"),
        ({"max_depth": {"type": "int", "low": 1.5, "high": 4}}, "max_depth: low of an int parameter must be a whole number"),
        ({"eta": {"type": "float", "low": "a", "high": 1}}, "eta: low must be a finite number"),
        ({"eta": {"type": "float", "low": 0, "high": 1, "step": 2}}, "eta: unexpected key"),
        ([], "search space must be a non-empty mapping"),
    ],
)
def test_bad_spaces_name_the_parameter_and_the_rule(raw, message):
    with pytest.raises(SpaceError, match=message):
        parse(raw, XGB, "xgboost")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(SpaceError, match="not found"):
        load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("eta: {type: float, low: [\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        load(bad)
