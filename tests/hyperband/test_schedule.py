from __future__ import annotations

import pytest

from prefect_hyperband.hyperband.schedule import Bracket, Rung, brackets, milestones, plan_summary, s_max


def table(plan: tuple[Bracket, ...]) -> list[list[tuple[int, int]]]:
    return [[(r.n_configs, r.resource) for r in b.rungs] for b in plan]


def test_paper_table_1_exactly():
    """Li et al., JMLR 2018, Table 1: R = 81, η = 3."""
    plan = brackets(1, 81, 3)
    assert [b.s for b in plan] == [4, 3, 2, 1, 0]
    assert table(plan) == [
        [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
        [(34, 3), (11, 9), (3, 27), (1, 81)],
        [(15, 9), (5, 27), (1, 81)],
        [(8, 27), (2, 81)],
        [(5, 81)],
    ]
    assert sum(b.n_configs for b in plan) == 143
    assert sum(r.n_configs for b in plan for r in b.rungs) == 206


@pytest.mark.parametrize(
    "args, expected_s_max",
    [((1, 1000, 10), 3), ((1, 243, 3), 5), ((1, 81, 3), 4), ((1, 27, 3), 3), ((1, 8, 2), 3), ((1, 1, 3), 0)],
)
def test_exact_powers_keep_every_bracket(args, expected_s_max):
    """A float log gives log(1000)/log(10) = 2.999…; the integer loop does not lose the top bracket."""
    assert s_max(*args) == expected_s_max
    plan = brackets(*args)
    assert len(plan) == expected_s_max + 1
    assert plan[0].rungs[0].resource == args[0]
    assert all(b.rungs[-1].resource == args[1] for b in plan)


def test_exact_power_1000_10():
    assert table(brackets(1, 1000, 10)) == [
        [(1000, 1), (100, 10), (10, 100), (1, 1000)],
        [(134, 10), (13, 100), (1, 1000)],
        [(20, 100), (2, 1000)],
        [(4, 1000)],
    ]


def test_rounding_when_R_over_r_is_not_a_power_of_eta():
    """Rung i of bracket s trains to ⌊R/η^(s−i)⌋: top rung exactly R, every rung ≥ r, one grid for all brackets."""
    plan = brackets(1, 100, 3)
    assert table(plan)[0] == [(81, 1), (27, 3), (9, 11), (3, 33), (1, 100)]
    assert table(plan)[-1] == [(5, 100)]
    assert milestones(1, 100, 3) == (1, 3, 11, 33, 100)
    plan = brackets(2, 27, 3)  # r·η^s ≤ R: s_max = 2, bottom rung ⌊27/9⌋ = 3 ≥ r = 2
    assert s_max(2, 27, 3) == 2
    assert table(plan) == [[(9, 3), (3, 9), (1, 27)], [(5, 9), (1, 27)], [(3, 27)]]
    for b in plan:
        assert all(r.resource >= 2 for r in b.rungs)


def test_resource_accounting_with_resume():
    """(1, 27, 3): 49 configs, 8 reach R, 357 units with resume, 49 × 27 = 1323 without early stopping."""
    plan = plan_summary(1, 27, 3)
    assert plan["configs"] == 49
    assert plan["reach_max_resource"] == 8
    assert plan["resource_used"] == 357
    assert plan["resource_without_early_stopping"] == 1323
    assert plan["resource_from_scratch"] > plan["resource_used"]
    assert Bracket(0, (Rung(4, 27),)).resource_used() == 108


@pytest.mark.parametrize(
    "args, message",
    [
        ((1, 81, 1), "eta must be an integer >= 2, got 1"),
        ((0, 81, 3), "min_resource must be an integer >= 1, got 0"),
        ((9, 3, 3), "min_resource must be <= max_resource, got 9 > 3"),
        ((1, 81.0, 3), "max_resource must be an integer, got 81.0"),
    ],
)
def test_invalid_schedules_name_the_rule(args, message):
    with pytest.raises(ValueError, match=message):
        brackets(*args)


def test_plan_summary_json_shape():
    plan = plan_summary(1, 81, 3)
    assert plan["configs"] == 143
    assert plan["brackets"][0] == {
        "s": 4,
        "rungs": [
            {"n_configs": 81, "resource": 1},
            {"n_configs": 27, "resource": 3},
            {"n_configs": 9, "resource": 9},
            {"n_configs": 3, "resource": 27},
            {"n_configs": 1, "resource": 81},
        ],
        "resource_used": 297,
    }
