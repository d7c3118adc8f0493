"""The user's priors: worker-seconds until the best-so-far first reaches a target, per sampler, several seeds.

The job's own scheduler (synchronous Hyperband, the same seed) runs with the trainer called inline, one
trial-rung at a time, no Prefect and no MLflow: what differs between the rows is only where configs come from.

* ``random``: the job's default (each bracket's configs drawn uniformly, seeded by (seed, s)).
* ``tpe``: Optuna's TPE fitted per rung, brackets in turn (BOHB), on the same space (no priors).
* ``priorband, good prior`` / ``priorband, bad prior``: ``--sampler priorband`` with the space's ``prior`` near a
  good region / in a poor one (``confidence: medium``).

Problems: the synthetic objective (Branin-shaped final losses, crossing learning curves; each unit sleeps
``--unit-seconds``, an emulated cost, so its worker-seconds are that emulation plus our own code) and XGBoost on
bank-marketing (val AUC; measured training and evaluation seconds). Per sampler: how many seeds reached the
target, the mean worker-seconds to reach it (a seed that never did counts its whole job, a lower bound: marked
``>=``), and that mean over random's, measured in the same run. Each problem's target is about random search's median final best over
seeds 0-4, fixed in advance of the comparison. (A per-seed target such as random's own final best favours random:
its best is its own luckiest draw.) Targets: priorband with a good prior at most 0.5x random's, with a bad prior at most 1.5x. Run from the repository root::

    python benchmarks/bench_priors.py                 # 5 seeds, synthetic (1, 81, 3) and XGBoost (1, 9, 3) (~6 min)
    python benchmarks/bench_priors.py --seeds 0,1 --problems synthetic
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


@dataclass(frozen=True)
class Problem:
    name: str
    direction: str
    space: dict[str, dict[str, Any]]
    good: dict[str, Any]  # prior values near a good region
    bad: dict[str, Any]  # and in a poor one
    target: float
    max_resource: int
    trainer: Callable[[int], Any]  # seed -> trainer
    suffix: str


def synthetic(unit_seconds: float) -> Problem:
    from prefect_hyperband.trainers.synthetic import DEFAULT_SPACE, SyntheticTrainer

    # good: beside one of the three optima (0.543, 0.152); bad: the corner (0, 0), where the final loss is 0.99
    return Problem("synthetic loss", "min", DEFAULT_SPACE, good={"x": 0.55, "y": 0.15}, bad={"x": 0.0, "y": 0.0},
                   target=0.005, max_resource=81,  # about random search's median final best over seeds 0-4
                   trainer=lambda seed: SyntheticTrainer(seed=seed, seconds_per_unit=unit_seconds), suffix=".json")


def xgboost() -> Problem:
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.xgboost_trainer import DEFAULT_SPACE, XGBoostTrainer

    # the best and the worst config at R of a random Hyperband (1, 9, 3) job on seed 100's split (not one of the
    # benchmark's seeds), rounded: a prior a user could have from an earlier job, and one from a poor guess
    # target 0.805: about random's median final best over seeds 0-4
    good = {"eta": 0.01, "alpha": 0.24, "min_child_weight": 4.0, "max_depth": 9, "colsample_bylevel": 0.39,
            "colsample_bytree": 0.68}
    bad = {"eta": 0.26, "alpha": 0.24, "min_child_weight": 2.4, "max_depth": 5, "colsample_bylevel": 0.98,
           "colsample_bytree": 0.72}
    return Problem("xgboost val_auc (bank-marketing)", "max", DEFAULT_SPACE, good, bad, target=0.805, max_resource=9,
                   trainer=lambda seed: XGBoostTrainer(datasets.DataSpec(seed=seed), workers=1, seed=seed, nthread=1),
                   suffix=".ubj")


def with_prior(space: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {**spec, "prior": values[name], "confidence": "medium"} for name, spec in space.items()}


def scheduler(problem: Problem, sampler: str, prior: dict[str, Any] | None, seed: int):
    from prefect_hyperband.hyperband.priorband import PriorBandSampler
    from prefect_hyperband.hyperband.sampler import TPESampler
    from prefect_hyperband.hyperband.scheduler import HyperbandScheduler
    from prefect_hyperband.hyperband.space import parse

    space = parse(with_prior(problem.space, prior) if prior else problem.space)
    r, big, eta, way = 1, problem.max_resource, 3, problem.direction
    if sampler == "random":
        return HyperbandScheduler(r, big, eta, way, space, seed)
    chosen = TPESampler(space, seed, way) if sampler == "tpe" else PriorBandSampler(space, seed, way, r, big, eta)
    return HyperbandScheduler(r, big, eta, way, space, seed, chosen, sequential=True)


def run(problem: Problem, sampler: str, prior: dict[str, Any] | None, seed: int,
        targets: tuple[float, ...]) -> dict[str, Any]:
    """The whole job, inline: the worker-seconds when the best-so-far first reached each target (None: never),
    the job's total and its final best."""
    sched = scheduler(problem, sampler, prior, seed)
    trainer = problem.trainer(seed)
    better = (lambda a, b: a >= b) if problem.direction == "max" else (lambda a, b: a <= b)
    spent, best = 0.0, None
    reached: list[float | None] = [None] * len(targets)
    with tempfile.TemporaryDirectory(prefix="bench-priors-") as tmp:
        while not sched.done:
            job = sched.next_job()
            assert job is not None, "a synchronous job always has a next trial-rung until done"
            began = time.perf_counter()
            trained = trainer.train(job.config, job.resource, job.checkpoint,
                                    f"{tmp}/{job.trial_id}-r{job.resource}{problem.suffix}")
            value = trainer.evaluate(trained.checkpoint)
            spent += time.perf_counter() - began
            sched.report(job.trial_id, job.resource, value, trained.checkpoint)
            best = value if best is None or better(value, best) else best
            reached = [at if at is not None or not better(best, t) else spent for at, t in zip(reached, targets)]
    trainer.close()
    return {"reached": reached, "total": spent, "best": best}


SAMPLERS = [("random", "random", None), ("tpe", "tpe", None), ("priorband, good prior", "priorband", "good"),
            ("priorband, bad prior", "priorband", "bad")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--problems", default="synthetic,xgboost")
    ap.add_argument("--unit-seconds", type=float, default=0.002, help="synthetic: emulated seconds per unit")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    common.header(f"priors: worker-seconds until the best-so-far reaches the target, seeds {seeds}")
    for name in args.problems.split(","):
        problem = synthetic(args.unit_seconds) if name == "synthetic" else xgboost()
        print(f"\n{problem.name}, Hyperband (1, {problem.max_resource}, 3), target {problem.target} ({problem.direction})",
              flush=True)
        rows, means = [], {}
        for label, sampler, which in SAMPLERS:
            prior = {"good": problem.good, "bad": problem.bad}.get(which or "")
            runs = [run(problem, sampler, prior, seed, (problem.target,)) for seed in seeds]
            costs = [r["reached"][0] if r["reached"][0] is not None else r["total"] for r in runs]
            censored = any(r["reached"][0] is None for r in runs)
            means[label] = statistics.fmean(costs)
            rows.append([label, f"{sum(r['reached'][0] is not None for r in runs)}/{len(runs)}",
                         ("≥ " if censored else "") + f"{means[label]:.2f}",
                         f"{statistics.fmean(r['total'] for r in runs):.2f}",
                         f"{statistics.fmean(r['best'] for r in runs):.4f}"])
            print(f"   {label}: {rows[-1][1]} reached, mean worker-s to target {rows[-1][2]}", flush=True)
        for row in rows:
            row.append(f"{means[row[0]] / means['random']:.2f}x")
        print(common.table(rows, ["sampler", "reached", "worker-s to target", "job worker-s", "final best", "x random"]))
        good, bad = means["priorband, good prior"] / means["random"], means["priorband, bad prior"] / means["random"]
        print(f"priorband good prior {good:.2f}x random (target <= 0.5x): {'met' if good <= 0.5 else 'MISSED'}; "
              f"bad prior {bad:.2f}x random (target <= 1.5x): {'met' if bad <= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
