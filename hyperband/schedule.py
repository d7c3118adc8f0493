"""The bracket schedule of Hyperband, Algorithm 1 of Li et al., JMLR 2018, in integer arithmetic.

With r = ``min_resource``, R = ``max_resource`` and η = ``eta``:

* s_max is the largest s with r·η^s ≤ R, found by an integer loop (a float log loses a
  bracket at exact powers: log(1000)/log(10) = 2.9999999999999996).
* Bracket s starts n = ⌈(s_max+1)·η^s / (s+1)⌉ configs; rung i holds ⌊n·η^(−i)⌋ of them.
* Rung i of bracket s trains to resource ⌊R / η^(s−i)⌋. Where R/r is a power of η this is
  exactly the paper's r_i = R·η^(i−s); otherwise each rung is R scaled down by η and
  floored, so the top rung is always exactly R, every rung is ≥ r (since r·η^s ≤ R), and
  rung resources are shared by all brackets (checkpoints line up on one grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rung:
    """Rung i of a bracket: ``n_configs`` trials trained to ``resource`` units."""

    n_configs: int
    resource: int


@dataclass(frozen=True)
class Bracket:
    """Bracket s: successive halving from ``rungs[0]`` up to R."""

    s: int
    rungs: tuple[Rung, ...]

    @property
    def n_configs(self) -> int:
        return self.rungs[0].n_configs

    def resource_used(self) -> int:
        """Units trained when promoted trials resume from their checkpoints."""
        total, below = 0, 0
        for rung in self.rungs:
            total += rung.n_configs * (rung.resource - below)
            below = rung.resource
        return total

    def resource_from_scratch(self) -> int:
        """Units trained if every rung retrained its trials from zero (what resume saves)."""
        return sum(rung.n_configs * rung.resource for rung in self.rungs)


def validate(min_resource: int, max_resource: int, eta: int) -> None:
    """Raise ``ValueError`` naming the field, the value and the rule."""
    for name, value in (("min_resource", min_resource), ("max_resource", max_resource), ("eta", eta)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if eta < 2:
        raise ValueError(f"eta must be an integer >= 2, got {eta}")
    if min_resource < 1:
        raise ValueError(f"min_resource must be an integer >= 1, got {min_resource}")
    if min_resource > max_resource:
        raise ValueError(f"min_resource must be <= max_resource, got {min_resource} > {max_resource}")


#: the largest plan a job accepts: its trials' state lives in memory and in one JSON file
MAX_TRIAL_RUNGS = 100_000


def check_size(min_resource: int, max_resource: int, eta: int) -> None:
    """Raise ``ValueError`` for a plan above ``MAX_TRIAL_RUNGS`` trial-rungs, with its figures."""
    plan = brackets(min_resource, max_resource, eta)
    trial_rungs = sum(r.n_configs for b in plan for r in b.rungs)
    if trial_rungs > MAX_TRIAL_RUNGS:
        configs = sum(b.n_configs for b in plan)
        raise ValueError(
            f"the plan (r={min_resource}, R={max_resource}, eta={eta}) has {trial_rungs:,} trial-rungs and {configs:,} "
            f"configs; the largest a job accepts is {MAX_TRIAL_RUNGS:,} trial-rungs: raise eta or min_resource, or lower max_resource"
        )


def s_max(min_resource: int, max_resource: int, eta: int) -> int:
    """The largest s with min_resource·η^s ≤ max_resource (integer loop, exact at powers)."""
    validate(min_resource, max_resource, eta)
    s = 0
    while min_resource * eta ** (s + 1) <= max_resource:
        s += 1
    return s


def brackets(min_resource: int, max_resource: int, eta: int) -> tuple[Bracket, ...]:
    """All brackets, most exploratory (s = s_max) first, as in the paper's Table 1."""
    top = s_max(min_resource, max_resource, eta)
    result = []
    for s in range(top, -1, -1):
        n = -(-(top + 1) * eta**s // (s + 1))  # ceil with integers
        rungs = tuple(Rung(n // eta**i, max_resource // eta ** (s - i)) for i in range(s + 1))
        result.append(Bracket(s, rungs))
    return tuple(result)


def plan_summary(min_resource: int, max_resource: int, eta: int) -> dict[str, Any]:
    """The schedule as plain data: what ``hyperband plan --json`` prints."""
    plan = brackets(min_resource, max_resource, eta)
    configs = sum(b.n_configs for b in plan)
    return {
        "min_resource": min_resource,
        "max_resource": max_resource,
        "eta": eta,
        "s_max": plan[0].s,
        "configs": configs,
        "trial_rungs": sum(r.n_configs for b in plan for r in b.rungs),
        "reach_max_resource": sum(b.rungs[-1].n_configs for b in plan),
        "resource_used": sum(b.resource_used() for b in plan),
        "resource_from_scratch": sum(b.resource_from_scratch() for b in plan),
        "resource_without_early_stopping": configs * max_resource,
        "brackets": [
            {
                "s": b.s,
                "rungs": [{"n_configs": r.n_configs, "resource": r.resource} for r in b.rungs],
                "resource_used": b.resource_used(),
            }
            for b in plan
        ],
    }


def render_plan(plan: dict[str, Any]) -> str:
    """``plan_summary`` as the table ``hyperband plan`` prints: each bracket's rungs, then the totals."""
    lines = [f"Hyperband plan: r={plan['min_resource']}, R={plan['max_resource']}, eta={plan['eta']} (s_max={plan['s_max']})"]
    depth = max(len(b["rungs"]) for b in plan["brackets"])
    header = ["bracket"] + [f"rung {i}" for i in range(depth)] + ["units"]
    rows = [header]
    for b in plan["brackets"]:
        cells = [f"s={b['s']}"] + [f"{r['n_configs']} @ {r['resource']}" for r in b["rungs"]]
        rows.append(cells + [""] * (depth + 1 - len(cells)) + [str(b["resource_used"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(
        f"{plan['configs']} configs, {plan['trial_rungs']} trial-rungs, {plan['reach_max_resource']} reach R; "
        f"resource {plan['resource_used']:,} units with early stopping and resume "
        f"({plan['resource_from_scratch']:,} if promotions retrained from scratch) vs "
        f"{plan['resource_without_early_stopping']:,} training every config to R"
    )
    return "\n".join(lines)


def milestones(min_resource: int, max_resource: int, eta: int) -> tuple[int, ...]:
    """Every rung resource of every bracket, ascending: the grid trainers reseed on."""
    return tuple(sorted({r.resource for b in brackets(min_resource, max_resource, eta) for r in b.rungs}))
