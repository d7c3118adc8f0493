"""The user's priors: worker-seconds until the best-so-far first reaches a target, per sampler, several seeds.

The job's own scheduler (synchronous Hyperband, or ASHA with ``--mode asha``; the same seed) runs with the
trainer called inline, one trial-rung at a time, no Prefect and no MLflow: what differs between the rows is only
where configs come from.

* ``random``: the job's default (each bracket's configs drawn uniformly, seeded by (seed, s)).
* ``tpe``: Optuna's TPE fitted per rung, brackets in turn (BOHB), on the same space (no priors).
* ``priorband, good prior`` / ``priorband, bad prior``: ``--sampler priorband`` with the space's ``prior`` near a
  good region / in a poor one (``confidence: medium``);
* ``priorband + prior first, good`` / ``bad``: the same after the priors' mode trained straight to R
  (``--prior-first``, as PriorBand ran when it was published).

Problems:

* ``synthetic``: Branin-shaped final losses, crossing learning curves; each unit sleeps ``--unit-seconds``, an
  emulated cost, so its worker-seconds are that emulation plus our own code;
* ``xgboost``: XGBoost on bank-marketing, val AUC (the job's default data and metric);
* ``xgboost-digits``: XGBoost on scikit-learn's digits, val log loss.

The XGBoost problems' worker-seconds are measured training and evaluation seconds. Per sampler: how many seeds
reached the target, the mean worker-seconds to reach it (a seed that never did counts its whole job, a lower
bound: marked ``>=``), each seed's with the resource of the result that reached it (``r=``), and that mean over
random's, measured in the same run. Targets: priorband with a good prior at most 0.5x random's, with a bad prior
at most 1.5x. Beside each ratio: a 90 % paired bootstrap interval over the seeds (the same resampled seeds for the
sampler and random) and on how many seeds the sampler got there before random, so a mean that rests on one lucky
or unlucky seed shows as one.

Each problem's target is fixed before any sampler runs, by no sampler:

* synthetic: 0.005, about random search's median final best over seeds 0-4 (the function is the same on every seed);
* XGBoost: per seed, the 90th percentile (10th for a loss) of ``--reference`` configs drawn uniformly (their own
  generator) and trained straight to R on that seed's split: "a top-10 % config". One fixed value does not work:
  on bank-marketing the split moves every config's AUC by up to 0.03 (seed 3's best is 0.793, seed 2's median
  0.816), more than configs differ on one split, so a fixed target is out of reach on some seeds for every
  sampler. (A per-seed target such as random's own final best favours random: its best is its own luckiest draw.)

The priors are a user's knowledge from an earlier job: for XGBoost, the best and the worst of 60 uniform configs
trained to R=27 on seed 100's split (not one of the benchmark's seeds); ``--derive-priors`` prints them again.
Run from the repository root::

    python benchmarks/bench_priors.py               # 5 seeds, synthetic (1, 81, 3), both XGBoost (1, 27, 3) (~16 min)
    python benchmarks/bench_priors.py --mode asha   # the same under ASHA (~18 min)
    python benchmarks/bench_priors.py --seeds 0,1 --problems synthetic
    python benchmarks/bench_priors.py --problems xgboost --best-at-r   # only models trained to R count
    python benchmarks/bench_priors.py --derive-priors --problems xgboost,xgboost-digits
    python benchmarks/bench_priors.py --landscape --problems xgboost --seeds 0,1,2,3,4,5,6,7,8,9  # ~4 min
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


@dataclass(frozen=True)
class Problem:
    name: str
    direction: str
    space: dict[str, dict[str, Any]]
    good: dict[str, Any]  # prior values near a good region
    bad: dict[str, Any]  # and in a poor one
    target: Callable[[int], float]  # seed -> the target on that seed
    max_resource: int
    trainer: Callable[[int], Any]  # seed -> trainer
    suffix: str


def synthetic(unit_seconds: float) -> Problem:
    from prefect_hyperband.trainers.synthetic_trainer import DEFAULT_SPACE, SyntheticTrainer

    # good: beside one of the three optima (0.543, 0.152); bad: the corner (0, 0), where the final loss is 0.99
    return Problem("synthetic loss", "min", DEFAULT_SPACE, good={"x": 0.55, "y": 0.15}, bad={"x": 0.0, "y": 0.0},
                   target=lambda seed: 0.005, max_resource=81,  # about random's median final best, seeds 0-4
                   trainer=lambda seed: SyntheticTrainer(seed=seed, seconds_per_unit=unit_seconds), suffix=".json")


#: the XGBoost problems: (data set, metric, direction) and the priors --derive-priors printed (60 uniform configs
#: trained to R=27 on seed 100's split, rounded), the best as the good prior and the worst as the bad one
XGBOOST: dict[str, dict[str, Any]] = {
    "xgboost": {"data": "bank-marketing", "metric": "auc", "direction": "max",
                "good": {"eta": 0.024, "alpha": 0.005, "min_child_weight": 8.9, "max_depth": 6,
                         "colsample_bylevel": 0.79, "colsample_bytree": 0.85},
                "bad": {"eta": 0.41, "alpha": 0.026, "min_child_weight": 3.2, "max_depth": 10,
                        "colsample_bylevel": 0.87, "colsample_bytree": 0.96}},
    "xgboost-digits": {"data": "digits", "metric": "logloss", "direction": "min",
                       "good": {"eta": 0.115, "alpha": 0.057, "min_child_weight": 1.09, "max_depth": 9,
                                "colsample_bylevel": 0.36, "colsample_bytree": 0.31},
                       "bad": {"eta": 0.024, "alpha": 6.667, "min_child_weight": 2.78, "max_depth": 2,
                               "colsample_bylevel": 0.65, "colsample_bytree": 0.91}},
}


def xgboost(name: str = "xgboost", max_resource: int = 27, reference: int = 30) -> Problem:
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    known = XGBOOST[name]
    data, metric, direction = known["data"], known["metric"], known["direction"]

    def trainer(seed: int):
        return XGBoostTrainer(datasets.DataSpec(data=data, seed=seed), workers=1, metric=metric, seed=seed, nthread=1)

    def target(seed: int) -> float:
        return top_tenth(reference_values(max_resource, trainer(seed), DEFAULT_SPACE, reference, seed), direction)

    return Problem(f"xgboost val_{metric} ({data})", direction, DEFAULT_SPACE, known["good"], known["bad"],
                   target=target, max_resource=max_resource, trainer=trainer, suffix=".ubj")


def reference_values(resource: int, trainer: Any, space: dict[str, dict[str, Any]], n: int, seed: int) -> list[float]:
    """A seed's reference configs (``n`` uniform draws of their own generator) trained straight to ``resource``."""
    return [value for value, _ in straight_to(resource, trainer, space, n, 10_000 + seed)]


def top_tenth(values: list[float], direction: str) -> float:
    """The target: the 90th percentile of the reference values (the 10th for a loss), "a top-10 % config"."""
    import numpy as np

    return float(np.quantile(values, 0.9 if direction == "max" else 0.1))


def straight_to(resource: int, trainer: Any, space: dict[str, dict[str, Any]], n: int, seed: int,
                given: tuple[dict[str, Any], ...] = ()) -> list[tuple[float, dict[str, Any]]]:
    """``n`` uniform configs (a generator of their own, ``seed``), after the ``given`` ones, each trained straight
    to ``resource``: (value, config) pairs, in that order."""
    import numpy as np

    from prefect_hyperband.hyperband.space import parse

    parsed, rng, out = parse(space), np.random.default_rng(seed), []
    with tempfile.TemporaryDirectory(prefix="bench-priors-ref-") as tmp:
        for i in range(len(given) + n):
            config = given[i] if i < len(given) else parsed.sample(rng)
            trained = trainer.train(config, resource, None, f"{tmp}/{i}.ubj")
            out.append((trainer.evaluate(trained.checkpoint), config))
    trainer.close()
    return out


def with_prior(space: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {**spec, "prior": values[name], "confidence": "medium"} for name, spec in space.items()}


def scheduler(problem: Problem, sampler: str, prior: dict[str, Any] | None, seed: int, mode: str = "hyperband",
              prior_first: bool = False):
    """The job's scheduler as the job makes it (executors/schedulers.make_scheduler): synchronous brackets (in turn for TPE
    and PriorBand), or ASHA with as many configs as the brackets would draw; after the priors' mode trained to R
    with ``prior_first`` (``--prior-first``)."""
    from prefect_hyperband.hyperband import priors, schedule
    from prefect_hyperband.hyperband.asha import AshaState
    from prefect_hyperband.hyperband.first import Firsts
    from prefect_hyperband.hyperband.priorband import PriorBandSampler
    from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
    from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler
    from prefect_hyperband.hyperband.space import parse

    space = parse(with_prior(problem.space, prior) if prior else problem.space)
    r, big, eta, way = 1, problem.max_resource, 3, problem.direction
    chosen = (RandomSampler(space, seed) if sampler == "random" else TPESampler(space, seed, way) if sampler == "tpe"
              else PriorBandSampler(space, seed, way, r, big, eta))
    if mode == "asha":
        configs = schedule.plan_summary(r, big, eta)["configs"]
        inner: Any = AshaScheduler(AshaState.create(r, big, eta, way), chosen, configs)
    elif sampler == "random":
        inner = HyperbandScheduler(r, big, eta, way, space, seed)
    else:
        inner = HyperbandScheduler(r, big, eta, way, space, seed, chosen, sequential=True)
    if prior_first:
        inner.first = Firsts.of(None, priors.mode(space), big)
    return inner


def run(problem: Problem, sampler: str, prior: dict[str, Any] | None, seed: int,
        targets: tuple[float, ...], mode: str = "hyperband", prior_first: bool = False,
        best_at_r: bool = False) -> dict[str, Any]:
    """The whole job, inline: the worker-seconds when the best-so-far first reached each target (None: never) and
    the resource of the result that reached it, the job's total and its final best. ``best_at_r``: only results
    at R count toward the best (models trained to the end); otherwise every result does, as the job's best."""
    sched = scheduler(problem, sampler, prior, seed, mode, prior_first)
    trainer = problem.trainer(seed)
    better = (lambda a, b: a >= b) if problem.direction == "max" else (lambda a, b: a <= b)
    spent, best = 0.0, None
    reached: list[float | None] = [None] * len(targets)
    at_resource: list[int | None] = [None] * len(targets)
    with tempfile.TemporaryDirectory(prefix="bench-priors-") as tmp:
        while not sched.done:
            job = sched.next_trial_rung()
            assert job is not None, "one trial-rung at a time: the job always has a next one until done"
            began = time.perf_counter()
            trained = trainer.train(job.config, job.resource, job.checkpoint,
                                    f"{tmp}/{job.trial_id}-r{job.resource}{problem.suffix}")
            value = trainer.evaluate(trained.checkpoint)
            spent += time.perf_counter() - began
            sched.report(job.trial_id, job.resource, value, trained.checkpoint)
            if best_at_r and job.resource != problem.max_resource:
                continue
            best = value if best is None or better(value, best) else best
            now = [at is None and better(best, t) for at, t in zip(reached, targets)]
            reached = [spent if hit else at for at, hit in zip(reached, now)]
            at_resource = [job.resource if hit else r for r, hit in zip(at_resource, now)]
    trainer.close()
    return {"reached": reached, "resource": at_resource, "total": spent, "best": best}


def ratio_interval(costs: list[float], base: list[float], level: float = 0.9, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """A paired bootstrap over seeds of mean(costs) / mean(base): seeds drawn with replacement, the same seeds for
    both, and the central ``level`` interval of the ratio. Few seeds give a wide interval; one wider than the
    target's side of 1x says the mean ratio is the seeds' luck as much as the sampler's."""
    import numpy as np

    a, b = np.asarray(costs, dtype=float), np.asarray(base, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(draws, len(a)))
    ratios = a[picks].mean(axis=1) / b[picks].mean(axis=1)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


#: (label, --sampler, which prior, --prior-first)
SAMPLERS = [("random", "random", None, False), ("tpe", "tpe", None, False),
            ("priorband, good prior", "priorband", "good", False), ("priorband, bad prior", "priorband", "bad", False),
            ("priorband + prior first, good", "priorband", "good", True),
            ("priorband + prior first, bad", "priorband", "bad", True)]


def derive_priors(name: str, max_resource: int) -> None:
    """An XGBoost problem's priors: the best and the worst of 60 uniform configs trained to R on seed 100's split."""
    problem = xgboost(name, max_resource)
    ranked = sorted(straight_to(max_resource, problem.trainer(100), problem.space, 60, 100), key=lambda vc: vc[0],
                    reverse=problem.direction == "max")
    for label, (value, config) in (("good", ranked[0]), ("bad", ranked[-1])):
        print(f"{name} {label}: {problem.name.split()[1]} {value:.4f} at R={max_resource}, seed 100: "
              + ", ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}" for k, v in config.items()))


def landscape(problem: Problem, seeds: list[int], reference: int) -> None:
    """Per seed, how far apart the top of an XGBoost problem is: the median, the target and the best of the
    reference configs, and each prior trained to R on that seed's split (the reference draws are the target's)."""
    import numpy as np

    print(f"\n{problem.name} at R={problem.max_resource}: the {reference} reference configs and the priors, per seed")
    rows = []
    for seed in seeds:
        values = reference_values(problem.max_resource, problem.trainer(seed), problem.space, reference, seed)
        priors = [value for value, _ in straight_to(problem.max_resource, problem.trainer(seed), problem.space, 0,
                                                    seed, (problem.good, problem.bad))]
        best = max(values) if problem.direction == "max" else min(values)
        rows.append([seed, float(np.median(values)), top_tenth(values, problem.direction), best, *priors])
    print(common.table([[r[0]] + [f"{v:.4f}" for v in r[1:]] for r in rows],
                       ["seed", "median", "target", "best", "good prior", "bad prior"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--problems", default="synthetic,xgboost,xgboost-digits")
    ap.add_argument("--unit-seconds", type=float, default=0.002, help="synthetic: emulated seconds per unit")
    ap.add_argument("--max-resource", type=int, default=27, help="XGBoost: R (units of 10 rounds)")
    ap.add_argument("--mode", choices=["hyperband", "asha"], default="hyperband",
                    help="synchronous brackets (the job's default) or ASHA, as --mode of the job")
    ap.add_argument("--reference", type=int, default=30, help="XGBoost: configs behind each seed's target")
    ap.add_argument("--derive-priors", action="store_true", help="print the XGBoost problems' priors and stop")
    ap.add_argument("--landscape", action="store_true",
                    help="XGBoost: per seed, the reference configs' median, target and best, and the priors at R")
    ap.add_argument("--best-at-r", action="store_true",
                    help="only results at R count toward the best-so-far (the job's best counts every rung)")
    args = ap.parse_args()
    if args.derive_priors:
        for name in args.problems.split(","):
            if name != "synthetic":
                derive_priors(name, args.max_resource)
        return None
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.landscape:
        for name in args.problems.split(","):
            if name != "synthetic":
                landscape(xgboost(name, args.max_resource, args.reference), seeds, args.reference)
        return None
    common.header(f"priors: worker-seconds until the best-so-far reaches the target, seeds {seeds}")
    for name in args.problems.split(","):
        problem = (synthetic(args.unit_seconds) if name == "synthetic"
                   else xgboost(name, args.max_resource, args.reference))
        targets = {seed: problem.target(seed) for seed in seeds}
        shown = ", ".join(f"{targets[seed]:.4g}" for seed in seeds)
        print(f"\n{problem.name}, {'ASHA' if args.mode == 'asha' else 'Hyperband'} (1, {problem.max_resource}, 3), "
              f"target per seed {shown} "
              f"({problem.direction}){'; only results at R count' if args.best_at_r else ''}", flush=True)
        rows, means, per_seed_costs = [], {}, {}
        for label, sampler, which, first in SAMPLERS:
            prior = {"good": problem.good, "bad": problem.bad}.get(which or "")
            runs = [run(problem, sampler, prior, seed, (targets[seed],), args.mode, first, args.best_at_r)
                    for seed in seeds]
            costs = [r["reached"][0] if r["reached"][0] is not None else r["total"] for r in runs]
            censored = any(r["reached"][0] is None for r in runs)
            means[label], per_seed_costs[label] = statistics.fmean(costs), costs
            rows.append([label, f"{sum(r['reached'][0] is not None for r in runs)}/{len(runs)}",
                         ("≥ " if censored else "") + f"{means[label]:.2f}",
                         f"{statistics.fmean(r['total'] for r in runs):.2f}",
                         f"{statistics.fmean(r['best'] for r in runs):.4f}"])
            per_seed = ", ".join(f"{c:.2f}" + (f" (r={r['resource'][0]})" if r["reached"][0] is not None else " (never)")
                                 for c, r in zip(costs, runs))
            print(f"   {label}: {rows[-1][1]} reached, mean worker-s to target {rows[-1][2]}; per seed {per_seed}",
                  flush=True)
        base = per_seed_costs["random"]
        ratios = {label: means[label] / means["random"] for label in means}
        intervals = {label: ratio_interval(costs, base) for label, costs in per_seed_costs.items()}
        for row in rows:
            costs, (low, high) = per_seed_costs[row[0]], intervals[row[0]]
            row += [f"{ratios[row[0]]:.2f}x", f"{low:.2f}-{high:.2f}x",
                    f"{sum(c < b for c, b in zip(costs, base))}/{len(base)}"]
        print(common.table(rows, ["sampler", "reached", "worker-s to target", "job worker-s", "final best", "x random",
                                  "90% over seeds", "faster"]))
        print("   x random: mean worker-s to target over random's; 90% over seeds: a paired bootstrap of that ratio "
              "over the seeds; faster: seeds on which the sampler reached it before random did")
        for name, good_row, bad_row in (("priorband", "priorband, good prior", "priorband, bad prior"),
                                        ("priorband + prior first", "priorband + prior first, good",
                                         "priorband + prior first, bad")):
            (good, (gl, gh)), (bad, (bl, bh)) = ((ratios[row], intervals[row]) for row in (good_row, bad_row))
            print(f"{name} good prior {good:.2f}x random (target <= 0.5x): {'met' if good <= 0.5 else 'MISSED'} "
                  f"(90% over seeds {gl:.2f}-{gh:.2f}x); bad prior {bad:.2f}x random (target <= 1.5x): "
                  f"{'met' if bad <= 1.5 else 'MISSED'} (90% over seeds {bl:.2f}-{bh:.2f}x)")


if __name__ == "__main__":
    main()
