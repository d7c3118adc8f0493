"""SyntheticTrainer: exact resume, determinism, config-dependent crossing curves, seeded failures."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.trainers.base import checkpoint_resource
from prefect_hyperband.trainers.synthetic_trainer import (
    DEFAULT_CONFIG,
    DEFAULT_SPACE,
    OPTIMA,
    PARAMS,
    SyntheticTrainer,
    decay,
    final_loss,
)

CONFIG = {"x": 0.3, "y": 0.7}


def test_protocol_attributes_and_space() -> None:
    t = SyntheticTrainer()
    assert (t.model, t.metric, t.direction, t.workers) == ("synthetic", "loss", "min", 1)
    space = parse(DEFAULT_SPACE, PARAMS, "synthetic")
    assert set(space.names) == PARAMS == set(DEFAULT_CONFIG)
    config = space.sample(np.random.default_rng(0))
    assert 0 < t.curve(config, 1)
    assert all(final_loss(x, y) < 1e-9 for x, y in OPTIMA)
    t.close()


def test_resume_equals_training_at_once(tmp_path: Path) -> None:
    t = SyntheticTrainer(seed=4)
    first = t.train(CONFIG, 3, None, str(tmp_path / "a3"))
    assert (first.resource, first.resource_trained, first.workers) == (3, 3, 1)
    assert json.loads((tmp_path / "a3").read_text()) == {"resource": 3, "config": CONFIG}
    assert checkpoint_resource(tmp_path / "a3.json") == 3
    resumed = t.train(CONFIG, 9, first.checkpoint, str(tmp_path / "a9"))
    assert (resumed.resource, resumed.resource_trained) == (9, 6)
    direct = t.train(CONFIG, 9, None, str(tmp_path / "b9"))
    assert t.evaluate(resumed.checkpoint) == t.evaluate(direct.checkpoint) == t.curve(CONFIG, 9)
    assert first.history + resumed.history == direct.history
    assert [h["step"] for h in direct.history] == list(range(1, 10))
    assert t.evaluate(first.checkpoint) == direct.history[2]["val_loss"]


def test_refuses_resource_not_above_checkpoint_and_other_config(tmp_path: Path) -> None:
    t = SyntheticTrainer()
    ck = t.train(CONFIG, 3, None, str(tmp_path / "c")).checkpoint
    for resource in (3, 2):
        with pytest.raises(ValueError, match="exceeding the checkpoint's 3"):
            t.train(CONFIG, resource, ck, str(tmp_path / "d"))
    with pytest.raises(ValueError, match="holds config"):
        t.train({"x": 0.1, "y": 0.7}, 9, ck, str(tmp_path / "d"))
    with pytest.raises(InputError, match="unknown synthetic parameter"):
        t.train({"x": 0.1, "lr": 0.1}, 1, None, str(tmp_path / "e"))
    with pytest.raises(InputError, match=r"x must be a number in \[0, 1\]"):
        t.train({"x": 1.5}, 1, None, str(tmp_path / "e"))
    with pytest.raises(InputError, match="workers"):
        SyntheticTrainer(workers=0)
    with pytest.raises(InputError, match="fail_rate"):
        SyntheticTrainer(fail_rate=1.5)


def test_deterministic_per_seed() -> None:
    a, b, c = SyntheticTrainer(seed=1), SyntheticTrainer(seed=1), SyntheticTrainer(seed=2)
    configs = [{"x": float(x), "y": float(y)} for x, y in np.random.default_rng(0).random((20, 2))]
    curves = [[t.curve(cfg, r) for cfg in configs for r in (1, 3, 9, 27)] for t in (a, b, c)]
    assert curves[0] == curves[1]
    assert curves[0] != curves[2]
    # key order does not matter, defaults fill in
    assert a.curve({"y": 0.7, "x": 0.3}, 5) == a.curve(CONFIG, 5)
    assert a.curve({}, 5) == a.curve(DEFAULT_CONFIG, 5)
    # noise off: the curve is the closed form and decreases in the resource
    quiet = SyntheticTrainer(noise=0.0)
    values = [quiet.curve(CONFIG, r) for r in (1, 3, 9, 27, 81, 10_000)]
    assert values == sorted(values, reverse=True)
    a, b = decay(0.3, 0.7)
    assert values[-1] == pytest.approx(final_loss(0.3, 0.7) + a * 10_000 ** (-b), rel=1e-12)
    assert values[-1] - final_loss(0.3, 0.7) < 0.01 * values[0]


def test_curves_differ_by_config_and_cross() -> None:
    t = SyntheticTrainer(seed=0)
    configs = [{"x": float(x), "y": float(y)} for x, y in np.random.default_rng(1).random((60, 2))]
    early = np.array([t.curve(c, 1) for c in configs])
    late = np.array([t.curve(c, 81) for c in configs])
    assert len(set(early.tolist())) == len(configs)
    assert np.all(late < early)  # everything learns
    crossings = sum(1 for i in range(60) for j in range(60) if early[i] < early[j] and late[i] > late[j])
    assert crossings > 0.05 * 60 * 59 / 2  # starting well does not always mean ending well
    assert np.corrcoef(early, late)[0, 1] > 0.5  # ... but usually does: early stopping pays


def test_fail_rate_fails_a_deterministic_share(tmp_path: Path) -> None:
    t = SyntheticTrainer(seed=3, fail_rate=0.3)
    configs = [{"x": float(x), "y": float(y)} for x, y in np.random.default_rng(2).random((200, 2))]
    failing = [c for c in configs if t.fails(c)]
    assert 0.2 < len(failing) / len(configs) < 0.4
    assert [SyntheticTrainer(seed=3, fail_rate=0.3).fails(c) for c in configs] == [t.fails(c) for c in configs]
    with pytest.raises(RuntimeError, match="synthetic failure"):
        t.train(failing[0], 1, None, str(tmp_path / "f"))
    assert not (tmp_path / "f").exists()
    ok = next(c for c in configs if not t.fails(c))
    assert t.train(ok, 1, None, str(tmp_path / "g")).resource == 1
    assert not any(SyntheticTrainer(fail_rate=0.0).fails(c) for c in configs)
    assert all(SyntheticTrainer(fail_rate=1.0).fails(c) for c in configs)


def test_seconds_per_unit_sleeps_per_unit_trained(tmp_path: Path) -> None:
    t = SyntheticTrainer(seconds_per_unit=0.02, workers=2)
    ck = t.train(CONFIG, 2, None, str(tmp_path / "s2"))
    began = time.perf_counter()
    result = t.train(CONFIG, 5, ck.checkpoint, str(tmp_path / "s5"))
    assert time.perf_counter() - began >= 0.06 and result.seconds >= 0.06
    assert result.workers == 2
