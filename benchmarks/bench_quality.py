"""Quality per cost: best validation AUC for the units trained, this project's jobs versus Optuna and random search.

XGBoost on bank-marketing, one resource unit = 10 boosting rounds, search space
``trainers.xgboost.config.DEFAULT_SPACE``, R = 27 units (r = 1, η = 3). For every seed
(the seed also fixes the stratified train/validation split, so every method of a seed sees
the same split):

* ``hyperband/random``, ``hyperband/tpe``, ``asha/random``, ``asha/tpe``: the real ``tune``
  flow (Prefect + MLflow, concurrency auto, baseline and registration off). Best = the best
  validation AUC of any evaluated (trial, resource), as the job reports it; units = the job's
  ``resource_used``.
* ``optuna/tpe+HB``, ``optuna/random+HB``: Optuna with
  ``HyperbandPruner(min_resource=1, max_resource=R, reduction_factor=3)``; each trial trains unit
  by unit (10 rounds, continuing the booster), reports the validation AUC after every unit
  (``trial.report``) and stops when ``trial.should_prune()``. Budget: the units the seed's
  ``hyperband/random`` job trained; the study stops once its summed units reach it (the trial
  running then stops at the budget). Best = the best AUC reported at any unit.
* ``random to R``: configs drawn at random from the space, each trained to R and evaluated
  there, until the same budget is spent (⌊budget / R⌋ configs).

Optuna and random search run in this process one trial at a time with all cores
(``nthread = os.cpu_count()``); the flows run ``cpu_count`` trials at once with one thread each.
Printed: method, mean ± sd of the best AUC over seeds, mean units, mean wall seconds.

Run from the repository root::

    python benchmarks/bench_quality.py          # 3 seeds, R=27 (~10 min on 2 cores)
    python benchmarks/bench_quality.py --quick  # 1 seed, R=9 (~1-2 min)
    python benchmarks/bench_quality.py --seeds 0 1 2 3 4 --methods optuna/tpe+HB "random to R"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

FLOWS = {  # label -> (mode, sampler)
    "hyperband/random": ("hyperband", "random"),
    "hyperband/tpe": ("hyperband", "tpe"),
    "asha/random": ("asha", "random"),
    "asha/tpe": ("asha", "tpe"),
}
OTHERS = ("optuna/tpe+HB", "optuna/random+HB", "random to R")
ROUNDS_PER_UNIT = 10


class Problem:
    """The XGBoost problem of one seed: its split, a shared training matrix, and the booster parameters."""

    def __init__(self, seed: int, rounds_per_unit: int = ROUNDS_PER_UNIT):
        import xgboost as xgb

        from prefect_hyperband.trainers import data as datasets
        from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

        self.rounds_per_unit = rounds_per_unit
        self.trainer = XGBoostTrainer(datasets.DataSpec(seed=seed), workers=1, seed=seed, rounds_per_unit=rounds_per_unit,
                                      nthread=os.cpu_count())
        self.data = self.trainer.data
        self.dtrain = xgb.QuantileDMatrix(self.data.X_train, self.data.y_train, nthread=os.cpu_count())
        self.seed = seed

    def train_units(self, config: dict[str, Any], booster, units: int, seed: int):
        import xgboost as xgb

        params = {**self.trainer.params(config), "seed": seed}
        return xgb.train(params, self.dtrain, num_boost_round=units * self.rounds_per_unit, xgb_model=booster)

    def auc(self, booster) -> float:
        from prefect_hyperband.trainers.data import score

        return score("auc", self.data.y_val, booster.inplace_predict(self.data.X_val))


def suggest(trial, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    config = {}
    for name, spec in space.items():
        if spec["type"] == "float":
            config[name] = trial.suggest_float(name, spec["low"], spec["high"], log=spec.get("log", False))
        elif spec["type"] == "int":
            config[name] = trial.suggest_int(name, spec["low"], spec["high"], log=spec.get("log", False))
        else:
            config[name] = trial.suggest_categorical(name, spec["choices"])
    return config


def run_optuna(problem: Problem, sampler_name: str, max_r: int, eta: int, budget: int, seed: int) -> dict[str, Any]:
    import optuna

    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed) if sampler_name == "tpe" else optuna.samplers.RandomSampler(seed=seed)
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_r, reduction_factor=eta)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    spent = {"units": 0, "best": -math.inf, "trials": 0}

    def objective(trial) -> float:
        config = suggest(trial, DEFAULT_SPACE)
        spent["trials"] += 1
        booster, value = None, -math.inf
        for unit in range(1, max_r + 1):
            if spent["units"] >= budget:
                study.stop()
                break
            booster = problem.train_units(config, booster, 1, seed)
            spent["units"] += 1
            value = problem.auc(booster)
            spent["best"] = max(spent["best"], value)
            trial.report(value, unit)
            if trial.should_prune():
                raise optuna.TrialPruned()
        if spent["units"] >= budget:
            study.stop()
        return value

    began = time.perf_counter()
    study.optimize(objective, n_trials=100_000)
    return {"best": spent["best"], "units": spent["units"], "wall": time.perf_counter() - began, "configs": spent["trials"]}


def run_random(problem: Problem, max_r: int, budget: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from prefect_hyperband.hyperband.space import parse
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

    space = parse(DEFAULT_SPACE)
    rng = np.random.default_rng([seed, 12345])
    began = time.perf_counter()
    best, units, n = -math.inf, 0, 0
    while units + max_r <= budget:
        booster = problem.train_units(space.sample(rng), None, max_r, seed)
        best = max(best, problem.auc(booster))
        units += max_r
        n += 1
    return {"best": best, "units": units, "wall": time.perf_counter() - began, "configs": n}


def run_flow(tmp: Path, mode: str, sampler: str, seed: int, max_r: int, eta: int) -> dict[str, Any]:
    from prefect_hyperband.tracking import store as mlflow_store

    uri = f"sqlite:///{tmp}/mlflow-{mode}-{sampler}-{seed}.db"
    mlflow_store.check_reachable(uri)
    result, wall = common.run_tune(
        model="xgboost", data="bank-marketing", mode=mode, sampler=sampler, min_resource=1, max_resource=max_r, eta=eta,
        seed=seed, concurrency=0, job_dir=str(tmp / "jobs"), job_id=f"{mode}-{sampler}-{seed}", tracking_uri=uri,
        experiment="bench-quality", register_model=False, baseline=False,
    )
    s = result["summary"]
    return {"best": s["best_score"], "units": s["resource_used"], "wall": wall, "configs": s["configs"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, R=9")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2; --quick: 0)")
    parser.add_argument("--max-resource", type=int, help="override R (default 27; --quick: 9)")
    parser.add_argument("--methods", nargs="+", choices=[*FLOWS, *OTHERS], help="a subset of the methods")
    args = parser.parse_args(argv)
    eta = 3
    max_r = args.max_resource or (9 if args.quick else 27)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    methods = args.methods or [*FLOWS, *OTHERS]

    from prefect_hyperband.hyperband import schedule

    plan = schedule.plan_summary(1, max_r, eta)
    common.header(f"bench_quality: XGBoost bank-marketing, R={max_r}, eta={eta}, seeds {seeds}")
    print(f"   Hyperband plan: {plan['configs']} configs, {plan['resource_used']} units; unit = {ROUNDS_PER_UNIT} rounds", flush=True)

    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    with common.workdir("quality") as tmp, common.prefect_server():
        for seed in seeds:
            budget = plan["resource_used"]  # the Hyperband job's units (checked against its summary below)
            for label in [m for m in methods if m in FLOWS]:
                mode, sampler = FLOWS[label]
                r = run_flow(tmp, mode, sampler, seed, max_r, eta)
                if label == "hyperband/random":
                    budget = r["units"]
                results[label].append(r)
                print(f"   seed {seed} {label}: AUC {r['best']:.4f}, {r['units']} units, {r['wall']:.1f} s", flush=True)
            problem = Problem(seed)
            for label in [m for m in methods if m in OTHERS]:
                if label == "random to R":
                    r = run_random(problem, max_r, budget, seed)
                else:
                    r = run_optuna(problem, "tpe" if "tpe" in label else "random", max_r, eta, budget, seed)
                results[label].append(r)
                print(f"   seed {seed} {label}: AUC {r['best']:.4f}, {r['units']} units, {r['wall']:.1f} s", flush=True)

    from statistics import fmean

    rows = []
    for label in methods:
        rs = results[label]
        rows.append((
            label, common.mean_sd([r["best"] for r in rs]), f"{fmean(r['units'] for r in rs):.0f}",
            f"{fmean(r['configs'] for r in rs):.0f}", f"{fmean(r['wall'] for r in rs):.1f}",
        ))
    print()
    print(f"best validation AUC over {len(seeds)} seed(s), R={max_r} units (budget = the hyperband/random job's units)")
    print(common.table(rows, ["method", "best val AUC (mean ± sd)", "units", "configs", "wall s"]))
    if "hyperband/random" in results and "optuna/tpe+HB" in results:
        hb = fmean(r["wall"] for r in results["hyperband/random"])
        op = fmean(r["wall"] for r in results["optuna/tpe+HB"])
        print(f"\nwall(hyperband/random flow) / wall(optuna/tpe+HB in-process) = {hb / op:.2f}")
    print(json.dumps({"bench": "quality", "max_resource": max_r, "seeds": seeds, "results": results}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
