"""The default job against Optuna on the same work: wall time and best AUC, several seeds.

XGBoost on bank-marketing, one unit = 1 boosting round (``--rounds-per-unit 1``), (r=1, R=81, η=3),
the default XGBoost search space, the seed's split for every method. Per seed:

* ``optuna random+HB``, ``optuna TPE+HB``: Optuna with ``HyperbandPruner(1, R, 3)``, in this process,
  one trial at a time, all cores (``nthread = os.cpu_count()``), written as Optuna's users write it:
  one ``xgb.train`` per trial with XGBoost computing the validation AUC every round, reported from a
  callback that stops the trial when it is pruned. Optuna stops after Hyperband's number of configs.
* ``hyperband, concurrency c``: the real ``tune`` flow (Prefect with a temporary server, MLflow to a
  fresh sqlite store, baseline and registration off); wall = the flow's own ``wall_seconds``.
* The floor under the flow (``--no-floor`` skips it): the trial-rungs the concurrency-1 flow trained, replayed
  one after another in this process with ``XGBoostTrainer`` (``bench_efficiency.replay``, all cores): a
  plain loop; the loop with the job's MLflow writes (a child run per trial, one ``log_batch`` per
  trial-rung, each run's tags and end); and that with train and evaluate as Prefect task runs in a flow.
  The last is what any job that keeps the issue's requirements (train and evaluate as task runs in the UI,
  a child run per trial with its per-step metrics) costs on this machine before its own code: the driver,
  the state file, the promote tasks. Walls exclude loading the data and starting the flow run, as the
  flow's ``wall_seconds`` does.

Prefect's own floor: a flow of two empty task runs per trial-rung, its wall and the CPU it takes from this process
and the Prefect server together (the server records each task run's events: on 2 cores that training keeps busy,
that CPU is wall). ``floor on busy cores`` = the loop with its MLflow writes + that CPU: what the job cannot go under
with its task runs and child runs kept, and each flow's wall over it.

Also printed: CPU seconds (user + system) of this process and its children (the temporary Prefect
server) during each method, which shows whether the cores, not waiting, bound the wall.

Printed per method: mean best AUC, mean rounds trained, mean wall, and wall / wall(optuna random+HB)
measured in the same run. Run from the repository root::

    python benchmarks/bench_vs_optuna.py                  # 3 seeds (~6 min on 2 cores)
    python benchmarks/bench_vs_optuna.py --seeds 0 --max-resource 27
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import bench_quality as quality  # noqa: E402


def run_optuna(problem: quality.Problem, sampler_name: str, max_r: int, eta: int, n_trials: int, seed: int) -> dict[str, Any]:
    """Optuna as its users write it for XGBoost: one ``xgb.train`` per trial, the validation AUC computed by
    XGBoost every round (``evals``), reported from a callback that stops the trial when pruned."""
    import optuna
    import xgboost as xgb

    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed) if sampler_name == "tpe" else optuna.samplers.RandomSampler(seed=seed)
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_r, reduction_factor=eta)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    dval = xgb.DMatrix(problem.data.X_val, problem.data.y_val, nthread=-1)
    spent = {"units": 0, "best": -math.inf}

    class Report(xgb.callback.TrainingCallback):
        def __init__(self, trial) -> None:
            self.trial, self.pruned = trial, False

        def after_iteration(self, model, epoch: int, evals_log) -> bool:
            value = evals_log["val"]["auc"][-1]
            spent["units"] += 1
            spent["best"] = max(spent["best"], value)
            self.trial.report(value, epoch + 1)
            self.pruned = self.trial.should_prune()
            return self.pruned  # True stops training

    def objective(trial) -> float:
        config = quality.suggest(trial, DEFAULT_SPACE)
        params = {**problem.trainer.params(config), "seed": seed, "eval_metric": "auc"}
        report = Report(trial)
        booster = xgb.train(params, problem.dtrain, num_boost_round=max_r * problem.rounds_per_unit,
                            evals=[(dval, "val")], callbacks=[report], verbose_eval=False)
        if report.pruned:
            raise optuna.TrialPruned()
        return problem.auc(booster)

    began = time.perf_counter()
    study.optimize(objective, n_trials=n_trials)
    return {"best": spent["best"], "units": spent["units"], "wall": time.perf_counter() - began}


def run_flow(tmp: Path, seed: int, max_r: int, eta: int, concurrency: int) -> dict[str, Any]:
    from prefect_hyperband.tracking import store as mlflow_store

    uri = f"sqlite:///{tmp}/mlflow-{seed}-{concurrency}.db"
    mlflow_store.check_reachable(uri)
    result, _ = common.run_tune(
        model="xgboost", data="bank-marketing", min_resource=1, max_resource=max_r, eta=eta, seed=seed,
        concurrency=concurrency, rounds_per_unit=1, job_dir=str(tmp / "jobs"), job_id=f"c{concurrency}-{seed}",
        tracking_uri=uri, experiment="bench-vs-optuna", register_model=False, baseline=False,
    )
    s = result["summary"]
    return {"best": s["best_score"], "units": s["resource_used"], "wall": s["wall_seconds"], "job_dir": result["job_dir"]}


def run_floor(tmp: Path, job_dir: str, seed: int, max_r: int, eta: int) -> dict[str, dict[str, Any]]:
    """The flow's trial-rungs replayed one after another: a plain loop, + its MLflow writes, + task runs."""
    import os

    import bench_efficiency as efficiency

    from prefect_hyperband.tracking import store as mlflow_store

    rows = efficiency.read_job(job_dir)
    out: dict[str, dict[str, Any]] = {}
    for label, mlflow, tasks in (("floor: plain loop of the c=1 trial-rungs", False, False),
                                 ("floor: + its MLflow writes", True, False),
                                 ("floor: + train/evaluate task runs", True, True)):
        uri = None
        if mlflow:
            uri = f"sqlite:///{tmp}/floor-{seed}-{len(out)}.db"
            mlflow_store.check_reachable(uri)  # creates the store, untimed (as for the flow)
        cpu = common.cpu_seconds()
        r = efficiency.replay(rows, seed, 1, max_r, eta, tmp / f"floor-{seed}-{len(out)}", nthread=os.cpu_count(),
                              rounds_per_unit=1, tracking_uri=uri, tasks=tasks)
        best = max(r["scores"].values())
        out[label] = {"best": best, "units": r["units"], "wall": r["loop"], "cpu": common.cpu_seconds() - cpu,
                      "trial_rungs": len(rows)}
    out[EMPTY] = run_empty_tasks(len(rows))
    return out


#: Prefect's own floor: a flow run of two empty task runs per trial-rung (train's and evaluate's), one after another
EMPTY = "floor: Prefect alone, 2 empty task runs per trial-rung"


def run_empty_tasks(trial_rungs: int) -> dict[str, Any]:
    """What Prefect's engine costs a trial-rung's two task runs on this machine, before any code of ours: a flow of
    ``2 x trial_rungs`` empty tasks (no cache, no result persisted, as train and evaluate), timed inside its run.
    ``cpu``: the CPU seconds they cost this process and the Prefect server (its events recorded after the flow
    returns included, its CPU at rest not): on cores that training keeps busy, what they take from it."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(name="empty", cache_policy=NO_CACHE, persist_result=False)
    def empty(i: int) -> int:
        return i

    @flow(name="bench-empty-tasks")
    def empties(n: int) -> float:
        began = time.perf_counter()
        for i in range(n):
            empty(i)
            empty(i)
        return time.perf_counter() - began

    before = common.cpu_seconds()
    time.sleep(SETTLE)  # the server's own CPU at rest, per second, taken off below for the whole window
    cpu = common.cpu_seconds()
    at_rest = (cpu - before) / SETTLE
    wall = empties(trial_rungs)
    time.sleep(SETTLE)  # the server records the task runs' events after the flow's last call returned
    used = common.cpu_seconds() - cpu - at_rest * (wall + SETTLE)
    return {"best": None, "units": 0, "wall": wall, "cpu": used}


#: seconds the empty tasks' CPU is measured past the flow's end (and, before it, the server at rest)
SETTLE = 3.0


def show(results: dict[str, list[dict[str, Any]]], seed: int, label: str, r: dict[str, Any]) -> None:
    results.setdefault(label, []).append({k: v for k, v in r.items() if k != "job_dir"})
    auc = "n/a" if r["best"] is None else f"{r['best']:.4f}"
    print(f"   seed {seed} {label}: AUC {auc}, {r['units']} rounds, {r['wall']:.1f} s, cpu {r['cpu']:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-resource", type=int, default=81)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-floor", dest="floor", action="store_false", help="skip the floor rows (replays of the c=1 flow)")
    parser.add_argument("--json", action="store_true", help="print one JSON document (ratios per seed and concurrency, "
                        "the floor rows, each trial-rung's cost beyond training) and nothing else")
    args = parser.parse_args(argv)
    max_r, eta = args.max_resource, 3
    stdout = sys.stdout
    if args.json:  # the progress lines and Prefect's to stderr: stdout is the one document
        sys.stdout = sys.stderr
    from prefect_hyperband.hyperband import schedule

    configs = schedule.plan_summary(1, max_r, eta)["configs"]
    common.header(f"bench_vs_optuna: XGBoost on bank-marketing, (1, {max_r}, 3), 1 round per unit, seeds {args.seeds}")
    results: dict[str, list[dict[str, Any]]] = {}
    with common.workdir("vs-optuna") as tmp, common.prefect_server():
        common.run_tune(model="synthetic", max_resource=3, job_dir=str(tmp / "warm"), tracking_uri=f"sqlite:///{tmp}/warm.db",
                        register_model=False, baseline=False)  # imports and first flow registration, not timed
        for seed in args.seeds:
            problem = quality.Problem(seed, rounds_per_unit=1)
            for label, sampler in (("optuna random+HB", "random"), ("optuna TPE+HB", "tpe")):
                cpu = common.cpu_seconds()
                r = run_optuna(problem, sampler, max_r, eta, configs, seed)
                show(results, seed, label, {**r, "cpu": common.cpu_seconds() - cpu})
            for c in args.concurrency:
                cpu = common.cpu_seconds()
                r = run_flow(tmp, seed, max_r, eta, c)
                show(results, seed, f"hyperband, concurrency {c}", {**r, "cpu": common.cpu_seconds() - cpu})
                if c == 1 and args.floor:
                    for label, f in run_floor(tmp, r["job_dir"], seed, max_r, eta).items():
                        show(results, seed, label, f)
    base = statistics.mean(r["wall"] for r in results["optuna random+HB"])
    rows = [
        (label, "n/a" if rs[0]["best"] is None else f"{statistics.mean(r['best'] for r in rs):.4f}", round(statistics.mean(r["units"] for r in rs)),
         statistics.mean(r["wall"] for r in rs), statistics.mean(r["wall"] for r in rs) / base,
         statistics.mean(r["cpu"] for r in rs))
        for label, rs in results.items()
    ]
    document = {"bench": "vs_optuna", "max_resource": max_r, "ratios": ratios(results), "results": results}
    if args.json:
        sys.stdout = stdout
        print(json.dumps(document))
        return 0
    print()
    print(common.table(rows, ["method", "mean best AUC", "rounds", "mean wall s", "x optuna random+HB", "cpu s"]))
    print(json.dumps(document))
    return 0


def ratios(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per seed (in the order run): each flow's wall over Optuna random+HB's of the same seed; and, where the floor
    ran, the c=1 flow's cost per trial-rung beyond the plain loop beside Prefect's own (two empty task runs)."""
    base = [r["wall"] for r in results["optuna random+HB"]]
    out: dict[str, Any] = {label: [round(r["wall"] / b, 3) for r, b in zip(rs, base)]
                           for label, rs in results.items() if label.startswith("hyperband")}
    flows, plain, empty = (results.get(k) for k in ("hyperband, concurrency 1", "floor: plain loop of the c=1 "
                                                    "trial-rungs", EMPTY))
    if flows and plain and empty:
        out["ms per trial-rung beyond training, ours"] = [
            round(1000 * (f["wall"] - p["wall"]) / max(1, p["trial_rungs"]), 1) for f, p in zip(flows, plain)]
        out["ms per trial-rung, Prefect's 2 empty task runs"] = [
            round(1000 * e["wall"] / max(1, p["trial_rungs"]), 1) for e, p in zip(empty, plain)]
        out["ms per trial-rung, Prefect's 2 empty task runs, CPU (client + server)"] = [
            round(1000 * e["cpu"] / max(1, p["trial_rungs"]), 1) for e, p in zip(empty, plain)]
    written = results.get("floor: + its MLflow writes")
    if written and empty:  # the floor on busy cores: the loop, its MLflow writes, and the CPU Prefect's tasks take
        floor = [w["wall"] + e["cpu"] for w, e in zip(written, empty)]
        out["floor on busy cores, s (plain loop + MLflow writes + empty task runs' CPU)"] = [round(f, 2) for f in floor]
        for label, rs in results.items():
            if label.startswith("hyperband"):
                out[f"{label}, x floor on busy cores"] = [round(r["wall"] / f, 3) for r, f in zip(rs, floor)]
    return out


if __name__ == "__main__":
    sys.exit(main())
