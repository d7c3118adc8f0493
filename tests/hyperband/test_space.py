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


@pytest.mark.parametrize(
    "text, message",
    [
        ("x: {type: int, low: 0, high: 100000000000000000000}\n", r"x: high of an int parameter must be within ±2\*\*53"),
        ("x: {type: float, low: -1.0e+308, high: 1.0e+308}\n", "x: high - low must be a finite number"),
        ("x: {type: float, low: 0, high: 1}\nx: {type: float, low: 5, high: 6}\n", r"'x' is given twice \(line 2\)"),
        ("x: {type: float, low: abc, high: 1}\n", "x: low must be a finite number, got 'abc'"),
    ],
)
def test_spaces_a_sampler_could_not_draw_from_are_refused_when_read(tmp_path, text, message):
    """Found by a fuzz of the CLI: an int range past numpy's int64 and a float range whose width overflows passed the
    checks and failed the job with a traceback at its first draw; a parameter written twice was the second one."""
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message):
        load(path)


def test_numbers_yaml_reads_as_strings_are_numbers_and_a_file_not_utf8_is_named(tmp_path):
    """PyYAML (YAML 1.1) reads ``1e-5`` as a string: it is the number it spells, as a user means it."""
    path = tmp_path / "space.yaml"
    path.write_text("lr: {type: float, low: 1e-5, high: 1e-1, log: true, prior: 1e-3}\nn: {type: int, low: 1e1, high: 1e2}\n")
    space = load(path)
    assert space.to_dict()["lr"] == {"type": "float", "low": 1e-5, "high": 0.1, "log": True, "prior": 1e-3,
                                     "confidence": "medium"}
    assert (space.params[1].low, space.params[1].high) == (10, 100)
    path.write_bytes(b"lr: {type: float, low: 0, high: 1} # \xff\n")
    with pytest.raises(SpaceError, match=r"space.yaml is not UTF-8 text"):
        load(path)
