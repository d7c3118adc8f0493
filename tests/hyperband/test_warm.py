"""Warm start's pure part: spaces compared, configs clipped, the parents' best, and the warm sampler."""

from __future__ import annotations

import pytest

from prefect_hyperband.hyperband import warm
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler
from prefect_hyperband.hyperband.space import parse

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "n": {"type": "int", "low": 1, "high": 10},
         "c": {"type": "categorical", "choices": ["a", "b", "c"]}}


def test_same_space_ignores_priors_and_sees_ranges():
    with_prior = {**SPACE, "x": {**SPACE["x"], "prior": 0.3, "confidence": "high"}}
    assert warm.same_space(parse(SPACE), parse(with_prior))
    assert not warm.same_space(parse(SPACE), parse({**SPACE, "x": {"type": "float", "low": 0.0, "high": 2.0}}))
    assert not warm.same_space(parse(SPACE), parse({k: v for k, v in SPACE.items() if k != "c"}))


def test_clip_moves_a_config_into_the_space_and_fills_what_it_lacks():
    space = parse(SPACE)
    assert warm.clip(space, {"x": 1.7, "n": 12.6, "c": "b"}) == {"x": 1.0, "n": 10, "c": "b"}
    # a choice the space has not, and a parameter the config lacks: the space's middle (priors.mode)
    assert warm.clip(space, {"x": 0.25, "c": "zz"}) == {"x": 0.25, "n": 6, "c": "a"}
    assert warm.clip(space, {"depth": 3, "c": "zz"}) is None  # nothing in common
    assert warm.in_common(space, {"x": 0.5, "c": "zz", "other": 1}) == ["x"]


def test_best_configs_rank_the_highest_resource_first_then_the_best_there():
    results = [({"x": 0.1}, 1, 0.9), ({"x": 0.1}, 3, 0.5), ({"x": 0.2}, 1, 0.1), ({"x": 0.3}, 3, 0.2),
               ({"x": 0.4}, 3, None), ({"x": 0.5}, 9, 0.7)]
    assert warm.best_configs(results, "min", 3) == [{"x": 0.5}, {"x": 0.3}, {"x": 0.1}]
    assert warm.best_configs(results, "max", 2) == [{"x": 0.5}, {"x": 0.1}]
    assert warm.best_configs([({"x": 0.4}, 3, None)], "min", 3) == []


def test_with_priors_sets_the_parents_best_where_the_user_gave_no_prior():
    space = parse({**SPACE, "n": {**SPACE["n"], "prior": 2}})
    primed, changed = warm.with_priors(space, {"x": 0.8, "n": 9, "c": "c"})
    assert changed == ["x", "c"]
    priors = {p.name: (p.prior, p.confidence) for p in primed.params}
    assert priors == {"x": (0.8, "medium"), "n": (2, "medium"), "c": ("c", "medium")}


def test_a_warm_tpe_fits_the_parents_results_from_its_first_draw():
    space = parse({"x": SPACE["x"]})
    results = [({"x": i / 10}, 3, abs(i / 10 - 0.7)) for i in range(10)]
    sampler = warm.WarmSampler.start(TPESampler(space, 1, "min"), results, [], 3, ["A"], "identical", observe=True)
    assert sampler.chosen_resource() == 3  # the model is fitted at once, not after the job's own results
    draws = [sampler.ask()["x"] for _ in range(20)]
    assert sum(abs(d - 0.7) < 0.25 for d in draws) >= 12  # near the parents' optimum, not uniform


def test_a_config_a_parent_trained_to_r_is_not_drawn_again():
    space = parse({"c": {"type": "categorical", "choices": ["a", "b"]}})
    results = [({"c": "a"}, 9, 0.5), ({"c": "b"}, 3, 0.4)]  # only "a" reached R=9
    sampler = warm.WarmSampler.start(RandomSampler(space, 0), results, [], 9, ["A"], "identical", observe=True)
    assert {sampler.ask()["c"] for _ in range(30)} == {"b"}
    assert sampler.redrawn > 0


def test_first_configs_come_first_and_the_sampler_round_trips_through_json():
    space = parse(SPACE)
    first = [{"x": 0.5, "n": 3, "c": "b"}, {"x": 0.9, "n": 1, "c": "a"}]
    sampler = warm.WarmSampler.start(RandomSampler(space, 4), [], first, 9, ["A"], "transfer", observe=False)
    assert sampler.ask() == first[0]
    again = warm.WarmSampler.from_json(sampler.to_json(), RandomSampler.from_json(space, sampler.to_json()["inner"]))
    assert again.ask() == sampler.ask() == first[1]
    assert [again.ask() for _ in range(3)] == [sampler.ask() for _ in range(3)]
    assert again.parents == ["A"] and again.kind == "transfer"


def test_a_warm_priorband_takes_its_incumbent_from_the_parents():
    space = parse({"x": {**SPACE["x"], "prior": 0.1}})
    results = [({"x": i / 20}, r, abs(i / 20 - 0.8) + 1 / r) for i in range(20) for r in (1, 3, 9)]
    inner = PriorBandSampler(space, 0, "min", 1, 9, 3)
    sampler = warm.WarmSampler.start(inner, results, [], 9, ["A"], "identical", observe=True)
    assert sampler.incumbent() == {"x": 0.8}
    assert sampler.shares(0)["incumbent"] > 0  # trusted at once: the parents spent a bracket and reached R


@pytest.mark.parametrize("mode", ["hyperband", "asha"])
def test_the_first_bracket_or_asha_starts_with_the_first_configs(mode):
    space = parse(SPACE)
    first = [{"x": 0.5, "n": 3, "c": "b"}, {"x": 0.9, "n": 1, "c": "a"}]
    sampler = warm.WarmSampler.start(RandomSampler(space, 4), [], first, 9, ["A"], "transfer", observe=False)
    if mode == "asha":
        sched = AshaScheduler(AshaState.create(1, 9, 3, "min"), sampler, 10)
    else:
        sched = HyperbandScheduler(1, 9, 3, "min", space, 0, sampler)
    configs = [sched.next_trial_rung().config for _ in range(3)]
    assert configs[:2] == first and configs[2] not in first
