"""Priors on the space and PriorBand's sampling policy, against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.priorband import PriorBandSampler, first_rung
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler
from prefect_hyperband.hyperband.space import SpaceError, parse

SPACE = parse({
    "x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.5},  # confidence medium: sigma 0.25
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True, "prior": 1e-3, "confidence": "high"},
    "depth": {"type": "int", "low": 1, "high": 9},
    "act": {"type": "categorical", "choices": ["relu", "tanh", "gelu"], "prior": "gelu", "confidence": "low"},
})


def test_a_space_keeps_its_priors_and_refuses_bad_ones() -> None:
    by = {p.name: p for p in SPACE.params}
    assert (by["x"].prior, by["x"].confidence) == (0.5, "medium")
    assert (by["lr"].prior, by["lr"].confidence) == (1e-3, "high") and by["depth"].prior is None
    assert parse(SPACE.to_dict()) == SPACE  # saved with the job, read back the same
    assert "prior" not in parse({"x": {"type": "float", "low": 0, "high": 1}}).to_dict()["x"]  # no prior: as before
    for spec, message in [
        ({"type": "float", "low": 0, "high": 1, "prior": 2}, "prior must be a number in [0.0, 1.0], got 2"),
        ({"type": "int", "low": 0, "high": 9, "prior": 2.5}, "prior of an int parameter must be a whole number"),
        ({"type": "categorical", "choices": ["a"], "prior": "b"}, "prior 'b' is not one of the choices ['a']"),
        ({"type": "float", "low": 0, "high": 1, "prior": 0.5, "confidence": "sure"}, "confidence must be one of low"),
        ({"type": "float", "low": 0, "high": 1, "confidence": "high"}, "confidence 'high' without a prior"),
    ]:
        with pytest.raises(SpaceError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse({"p": spec})


def test_prior_draws_gather_at_the_prior_by_confidence() -> None:
    rng = np.random.default_rng(0)
    draws = [priors.sample_prior(SPACE, rng) for _ in range(4000)]
    xs = np.array([d["x"] for d in draws])
    lrs = np.log10([d["lr"] for d in draws])
    assert abs(xs.mean() - 0.5) < 0.01 and 0.19 < xs.std() < 0.23  # N(.5, .25) cut to [0, 1]: sd ~0.21
    assert abs(np.median(lrs) + 3) < 0.05 and lrs.std() < 0.4  # high confidence: sigma 1/8 of 3 decades
    acts = [d["act"] for d in draws]
    assert acts.count("gelu") / len(acts) == pytest.approx(2 / 4, abs=0.03)  # weight 2 against 1 + 1
    assert sorted({d["depth"] for d in draws}) == list(range(1, 10))  # no prior: uniform


def test_densities_integrate_to_one() -> None:
    x = next(p for p in SPACE.params if p.name == "x")
    grid = np.linspace(0, 1, 20001)
    values = [priors.density(x, g, 0.9, "medium") for g in grid]
    assert float(np.trapezoid(values, grid)) == pytest.approx(1.0, abs=1e-6)
    act = next(p for p in SPACE.params if p.name == "act")
    assert sum(priors.density(act, c, "gelu", "high") for c in act.choices) == pytest.approx(1.0)


def test_mutation_moves_about_half_the_parameters_and_never_keeps_a_moved_choice() -> None:
    rng = np.random.default_rng(1)
    centre = {"x": 0.5, "lr": 1e-3, "depth": 5, "act": "relu"}
    moved = [priors.mutate(SPACE, centre, rng) for _ in range(2000)]
    assert np.mean([m["x"] != 0.5 for m in moved]) == pytest.approx(0.5, abs=0.03)
    assert np.mean([m["act"] != "relu" for m in moved]) == pytest.approx(0.5, abs=0.03)


ONE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.5}})


def test_shares_before_the_incumbent_is_trusted_follow_the_first_rung() -> None:
    sampler = PriorBandSampler(ONE, 0, "min", 1, 9, 3)
    # p_U = 1 / (1 + 3^r): r=0 (bracket s=2, r_min) .5; r=1 .25; r=2 (bracket s=0, R) .1
    assert sampler.shares(0) == {"prior": 0.5, "uniform": 0.5, "incumbent": 0.0}
    assert sampler.shares(1) == {"prior": 0.75, "uniform": 0.25, "incumbent": 0.0}
    assert sampler.shares(2) == pytest.approx({"prior": 0.9, "uniform": 0.1, "incumbent": 0.0})
    assert [first_rung(1, 9, 3, s) for s in (2, 1, 0)] == [0, 1, 2]


def _phi_mass(u: float, c: float, sigma: float = 0.25) -> float:
    """The truncated normal's density, written out."""
    cdf = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    return math.exp(-0.5 * ((u - c) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi) * (cdf((1 - c) / sigma) - cdf(-c / sigma)))


def test_shares_once_trusted_split_the_prior_by_the_top_configs_likelihoods() -> None:
    sampler = PriorBandSampler(ONE, 0, "min", 1, 9, 3)
    # (1, 9, 3)'s widest bracket: 9 at r=1, 3 at r=3, 1 at r=9; one bracket's worth = 9x1 + 3x2 + 1x6 = 21 units
    for i in range(9):
        sampler.tell({"x": i / 10}, 1, 1.0 - i / 100)
    for x, loss in ((0.3, 0.5), (0.7, 0.6), (0.8, 0.7)):
        sampler.tell({"x": x}, 3, loss)
    assert sampler.shares(0)["incumbent"] == 0.0  # no result at R yet
    sampler.tell({"x": 0.9}, 9, 0.2)  # the incumbent: the best at R
    # spent 9 + 3x2 + 6 = 21; the highest rung with >= 3 results is r=3, its top 3 // 3 = 1: x = .3 (weight 1)
    prior, incumbent = _phi_mass(0.3, 0.5), _phi_mass(0.3, 0.9)
    shares = sampler.shares(0)
    assert shares["uniform"] == 0.5
    assert shares["prior"] == pytest.approx(0.5 * prior / (prior + incumbent))
    assert shares["incumbent"] == pytest.approx(0.5 * incumbent / (prior + incumbent))
    assert sampler.incumbent() == {"x": 0.9}


def test_the_incumbent_is_the_best_result_at_any_resource_as_neps_takes_it() -> None:
    sampler = PriorBandSampler(ONE, 0, "min", 1, 9, 3)
    for i in range(9):
        sampler.tell({"x": i / 10}, 1, 1.0 - i / 100)
    for x, loss in ((0.3, 0.1), (0.7, 0.6), (0.8, 0.7)):  # x = .3 at r=3 beats the result at R below
        sampler.tell({"x": x}, 3, loss)
    sampler.tell({"x": 0.9}, 9, 0.2)
    assert sampler.incumbent() == {"x": 0.3}
    # the top 1 of r=3 is x = .3 itself: the density around the incumbent is centred on it
    prior, incumbent = _phi_mass(0.3, 0.5), _phi_mass(0.3, 0.3)
    assert sampler.shares(0)["incumbent"] == pytest.approx(0.5 * incumbent / (prior + incumbent))
    sampler.tell({"x": 0.6}, 9, 0.1)  # a tie at a higher resource wins it
    assert sampler.incumbent() == {"x": 0.6}


def test_draws_resume_exactly_from_json() -> None:
    a = PriorBandSampler(SPACE, 7, "max", 1, 27, 3)
    for _ in range(5):
        a.tell(a.ask_at(1), 1, 0.5)
    b = PriorBandSampler.from_json(SPACE, a.to_json())
    assert [a.ask_at(2) for _ in range(10)] == [b.ask_at(2) for _ in range(10)]
    assert a.draws == b.draws and sum(a.draws.values()) == 15


def test_the_schedulers_tell_priorband_each_brackets_first_rung() -> None:
    seen: list[int] = []

    class Recording(PriorBandSampler):
        def ask_at(self, rung: int):
            seen.append(rung)
            return super().ask_at(rung)

    hb = HyperbandScheduler(1, 9, 3, "min", ONE, 0, Recording(ONE, 0, "min", 1, 9, 3), sequential=True)
    while (job := hb.next_trial_rung()) is not None:
        hb.report(job.trial_id, job.resource, job.config["x"], "ck")
    assert seen == [0] * 9 + [1] * 5 + [2] * 3  # brackets s = 2, 1, 0 in turn: 9, 5 and 3 configs
    seen.clear()
    asha = AshaScheduler(AshaState.create(1, 9, 3, "min", brackets=(2, 0)), Recording(ONE, 0, "min", 1, 9, 3), 4)
    for _ in range(4):
        asha.next_trial_rung()
    assert sorted(seen) == [0, 0, 0, 2]  # D'Hondt over n = 9 and 3


def test_the_priors_mode_takes_each_prior_and_the_centre_of_the_rest():
    space = parse({"lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},  # no prior: the log's middle
                   "depth": {"type": "int", "low": 2, "high": 10, "prior": 6},
                   "act": {"type": "categorical", "choices": ["relu", "gelu"]},  # no prior: the first choice
                   "drop": {"type": "float", "low": 0.0, "high": 0.5, "prior": 0.1, "confidence": "low"}})
    mode = priors.mode(space)
    assert mode == {"lr": pytest.approx(1e-2), "depth": 6, "act": "relu", "drop": 0.1}
