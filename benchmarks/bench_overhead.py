"""Orchestration overhead: what Prefect + MLflow add per trial-rung on top of the Hyperband arithmetic.

The full (r=1, R=81, η=3) schedule (5 brackets, 143 configs, 206 trial-rungs) on the synthetic
objective with no emulated cost (``unit_seconds=0``: training is a closed-form curve and a tiny
JSON checkpoint), so nearly all time measured is orchestration. Measured in one process run:

* ``plain loop``: BracketState + SyntheticTrainer + promotion in a Python loop (no Prefect, no
  MLflow), brackets in turn; same seed, so the same configs and the same best score as the flow.
* ``loop + state files``: the same, also writing the bracket state JSON after every trial-rung
  (what the flow does for ``--resume``).
* ``loop + MLflow``: the same, plus the flow's MLflow calls made directly through
  ``tracking.runs`` (parent run, one child run per trial, per-unit history and metrics at
  every trial-rung, status tags and run end, summary) to a fresh sqlite store.
* ``tune flow, concurrency c``: the real ``flows.tune.tune`` flow (Prefect tasks and subflows on
  a temporary Prefect server, MLflow to a fresh sqlite store; baseline and registration off).

Printed: wall seconds, milliseconds per trial-rung, and each row's ratio to the plain loop;
the difference between rows splits the overhead into state files, MLflow and Prefect.

Run from the repository root::

    python benchmarks/bench_overhead.py          # R=81, 206 trial-rungs (~5-8 min on 2 cores)
    python benchmarks/bench_overhead.py --quick  # R=9, 22 trial-rungs (~1 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def plain_loop(min_r: int, max_r: int, eta: int, seed: int, out: Path,
               on_rung: Callable[..., None] | None = None, on_trial_rung: Callable[..., None] | None = None,
               state_files: bool = False) -> dict[str, Any]:
    """Hyperband's brackets in turn with the plain state machine: no Prefect, no MLflow."""
    from prefect_hyperband.common.files import write_json_atomic
    from prefect_hyperband.hyperband import schedule
    from prefect_hyperband.hyperband.bracket import BracketState
    from prefect_hyperband.hyperband.space import parse
    from prefect_hyperband.trainers.synthetic_trainer import DEFAULT_SPACE, PARAMS, SyntheticTrainer

    trainer = SyntheticTrainer(seed=seed, seconds_per_unit=0.0)
    space = parse(parse(DEFAULT_SPACE, PARAMS, "synthetic").to_dict())  # as flows.job does: to_dict and back
    n, best = 0, None
    for bracket in schedule.brackets(min_r, max_r, eta):
        state = BracketState.start(bracket, eta, space, seed, "min")
        rows: list[dict[str, Any]] = []
        if on_rung:
            on_rung("start", state)
        while not state.done:
            resource = state.current.resource
            for t in state.pending():
                trial = state.trials[t]
                path = out / "checkpoints" / t / f"r{resource}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                trained = trainer.train(trial.config, resource, trial.checkpoint, str(path))
                score = trainer.evaluate(trained.checkpoint)
                state.record(t, resource, score, trained.checkpoint)
                rows.append({"trial_id": t, "resource": resource, "score": score, "seconds": trained.seconds})
                n += 1
                if best is None or score < best:
                    best = score
                if on_trial_rung:
                    on_trial_rung(state, t, resource, trained, score)
                if state_files:
                    write_json_atomic(out / "brackets" / f"s{state.s}.json", {"state": state.to_json(), "rows": rows})
            before = list(state.active)
            state.advance()
            if on_rung:
                on_rung("advance", state, before)
    return {"trial_rungs": n, "best_score": best}


def loop_with_mlflow(min_r: int, max_r: int, eta: int, seed: int, out: Path, uri: str) -> dict[str, Any]:
    """The plain loop plus the MLflow calls the flow makes, straight through ``tracking.runs``."""
    from prefect_hyperband.tracking import runs as tracking
    from prefect_hyperband.tracking import store as mlflow_store

    mlflow_store.check_reachable(uri)
    parent = tracking.start_parent(uri, "bench-overhead", "loop", {"min_resource": min_r, "max_resource": max_r, "eta": eta}, {})
    run_ids: dict[str, str] = {}

    def on_rung(event: str, state, before=None) -> None:
        if event == "start":
            return
        for t in before:
            trial = state.trials[t]
            if trial.status != "running":
                tracking.set_tags(uri, run_ids[t], {"hyperband.highest_rung": str(trial.rung), "hyperband.status": trial.status})
                tracking.end_run(uri, run_ids[t], "FINISHED")

    def on_trial_rung(state, t, resource, trained, score) -> None:
        # as the flow does: a trial's child run comes with its first result, params and metrics in one batch
        params = None
        if t not in run_ids:
            run_ids[t] = tracking.create_child(uri, parent, t, {"hyperband.status": "running"}, time.time() - trained.seconds)
            params = {**state.trials[t].config, "workers": 1, "trial_id": t, "bracket": state.s}
        metrics = {"train_seconds": trained.seconds, "worker_seconds": trained.seconds, "val_loss": score}
        tracking.log_result(uri, run_ids[t], trained.history, metrics, resource, params)

    result = plain_loop(min_r, max_r, eta, seed, out, on_rung, on_trial_rung, state_files=True)
    tracking.log_metrics(uri, parent, {"best_val_loss": result["best_score"]})
    tracking.log_json(uri, parent, {"best": result["best_score"]}, "summary.json")
    tracking.end_run(uri, parent)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R=9 (22 trial-rungs) instead of R=81 (206)")
    parser.add_argument("--max-resource", type=int, help="override R")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2], help="flow concurrencies to time")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the (cheap) plain loops; the median is kept")
    args = parser.parse_args(argv)
    min_r, eta, seed = 1, 3, 0
    max_r = args.max_resource or (9 if args.quick else 81)

    from prefect_hyperband.hyperband import schedule

    plan = schedule.plan_summary(min_r, max_r, eta)
    common.header(f"bench_overhead: Hyperband (r={min_r}, R={max_r}, eta={eta}) on the synthetic objective, unit_seconds=0")
    print(f"   {plan['configs']} configs, {plan['trial_rungs']} trial-rungs, {plan['resource_used']} units", flush=True)

    rows: list[tuple[str, float, int, float]] = []  # label, wall, trial-rungs, best
    with common.workdir("overhead") as tmp:

        def timed(label: str, fn: Callable[[Path], dict[str, Any]]) -> None:
            from prefect_hyperband.tracking import store as mlflow_store

            walls, result = [], {}
            for i in range(args.repeats):
                out = tmp / f"{label.replace(' ', '_')}-{i}"
                mlflow_store.check_reachable(f"sqlite:///{out}.db")  # create a store's tables before timing
                began = time.perf_counter()
                result = fn(out)
                walls.append(time.perf_counter() - began)
            rows.append((label, statistics.median(walls), result["trial_rungs"], result["best_score"]))
            print(f"   {label}: {statistics.median(walls):.3f} s (median of {len(walls)})", flush=True)

        timed("plain loop", lambda out: plain_loop(min_r, max_r, eta, seed, out))
        timed("loop + state files", lambda out: plain_loop(min_r, max_r, eta, seed, out, state_files=True))
        timed("loop + state + MLflow", lambda out: loop_with_mlflow(min_r, max_r, eta, seed, out, f"sqlite:///{out}.db"))

        with common.prefect_server():
            from prefect_hyperband.tracking import store as mlflow_store

            # warm-up: imports, first flow run registration; not timed
            warm = tmp / "warmup"
            common.run_tune(model="synthetic", min_resource=1, max_resource=3, eta=3, seed=seed, concurrency=1,
                            job_dir=str(warm), tracking_uri=f"sqlite:///{warm}.db", register_model=False, baseline=False)
            for c in args.concurrency:
                uri = f"sqlite:///{tmp}/flow-c{c}.db"
                mlflow_store.check_reachable(uri)  # create the store's tables before timing
                result, wall = common.run_tune(
                    model="synthetic", min_resource=min_r, max_resource=max_r, eta=eta, seed=seed, concurrency=c,
                    unit_seconds=0.0, job_dir=str(tmp / f"flow-c{c}"), tracking_uri=uri, experiment="bench-overhead",
                    register_model=False, baseline=False,
                )
                s = result["summary"]
                rows.append((f"tune flow, concurrency {c}", wall, s["trial_rungs"], s["best_score"]))
                print(f"   tune flow, concurrency {c}: {wall:.1f} s", flush=True)

    base = rows[0][1]
    table = [
        (label, wall, 1000 * wall / n, wall / base, n, f"{best:.6f}")
        for label, wall, n, best in rows
    ]
    print()
    print(common.table(table, ["variant", "wall s", "ms / trial-rung", "x plain loop", "trial-rungs", "best loss"]))
    by = {label: wall for label, wall, _, _ in rows}
    n = plan["trial_rungs"]
    print()
    print("where a trial-rung's time goes (ms, differences of the rows above):")
    print(f"   Hyperband + synthetic training  {1000 * by['plain loop'] / n:8.2f}")
    print(f"   bracket state files             {1000 * (by['loop + state files'] - by['plain loop']) / n:8.2f}")
    print(f"   MLflow (sqlite store)           {1000 * (by['loop + state + MLflow'] - by['loop + state files']) / n:8.2f}")
    for c in args.concurrency:
        label = f"tune flow, concurrency {c}"
        print(f"   Prefect etc., concurrency {c}    {1000 * (by[label] - by['loop + state + MLflow']) / n:8.2f}")
    if len({round(best, 12) for *_, best in rows}) != 1:
        print("WARNING: the variants found different best scores (they should share configs and curves)")
    print(json.dumps({"bench": "overhead", "max_resource": max_r, "rows": [dict(zip(("variant", "wall_s", "trial_rungs", "best"), r)) for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
