"""Scaling with trial concurrency: wall time of one job at concurrency 1, 2, ... for sync Hyperband and ASHA.

The real ``tune`` flow (temporary Prefect server, MLflow to a fresh sqlite store, baseline and
registration off) on the synthetic objective with an emulated cost: ``unit_seconds`` seconds of
sleep per resource unit trained. Sleeping holds a trial slot like real training does but needs
no core, so it shows what the scheduler can overlap; the orchestration itself (Prefect task
runs, MLflow writes) still needs CPU, which is what limits the speed-up on a small machine.
Concurrencies: 1, 2, and ``2 × os.cpu_count()`` (more slots than cores: fine for sleeping
trials, not for CPU-bound ones). ``--xgboost`` adds XGBoost (bank-marketing, ``workers 1``)
sync Hyperband at concurrency 1 and ``os.cpu_count()``, where the training does need the cores.

Printed per (objective, mode, concurrency): wall seconds, the job's summed training seconds
(its ``sequential_seconds``), the ideal wall (training / concurrency), the speed-up over
concurrency 1 and the parallel efficiency (speed-up / concurrency).

Run from the repository root::

    python benchmarks/bench_scaling.py            # R=27, unit_seconds=0.1 (~7 min on 2 cores)
    python benchmarks/bench_scaling.py --xgboost  # also XGBoost R=27 at concurrency 1 and cpu_count
    python benchmarks/bench_scaling.py --quick    # R=9, unit_seconds=0.1, sync and ASHA at 1 and 2 (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def run(tmp: Path, label: str, **fields: Any) -> dict[str, Any]:
    from prefect_hyperband.tracking import store as mlflow_store

    uri = f"sqlite:///{tmp}/{label}.db"
    mlflow_store.check_reachable(uri)
    result, wall = common.run_tune(job_dir=str(tmp / "jobs"), job_id=label, tracking_uri=uri, experiment="bench-scaling",
                                   register_model=False, baseline=False, **fields)
    s = result["summary"]
    return {"wall": wall, "train": s["sequential_seconds"], "units": s["resource_used"], "best": s["best_score"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R=9, concurrency 1 and 2 only")
    parser.add_argument("--max-resource", type=int, help="override R (default 27; --quick: 9)")
    parser.add_argument("--unit-seconds", type=float, default=0.1, help="emulated seconds per synthetic unit")
    parser.add_argument("--concurrency", type=int, nargs="+", help="concurrencies (default 1 2 2*cpu_count)")
    parser.add_argument("--modes", nargs="+", default=["hyperband", "asha"], choices=["hyperband", "asha"])
    parser.add_argument("--xgboost", action="store_true", help="also XGBoost sync Hyperband at concurrency 1 and cpu_count")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    max_r = args.max_resource or (9 if args.quick else 27)
    levels = args.concurrency or ([1, 2] if args.quick else sorted({1, 2, cores, 2 * cores}))

    from prefect_hyperband.hyperband import schedule

    plan = schedule.plan_summary(1, max_r, 3)
    common.header(f"bench_scaling: R={max_r}, eta=3, synthetic unit_seconds={args.unit_seconds}, concurrency {levels}")
    print(f"   {plan['configs']} configs, {plan['trial_rungs']} trial-rungs, {plan['resource_used']} units "
          f"(= {plan['resource_used'] * args.unit_seconds:.1f} s of emulated training for sync Hyperband)", flush=True)

    rows: list[tuple[str, str, int, dict[str, Any]]] = []
    with common.workdir("scaling") as tmp, common.prefect_server():
        warm = tmp / "warmup"  # imports and first flow registration, not timed
        common.run_tune(model="synthetic", min_resource=1, max_resource=3, eta=3, concurrency=1, job_dir=str(warm),
                        tracking_uri=f"sqlite:///{warm}.db", register_model=False, baseline=False)
        for mode in args.modes:
            for c in levels:
                r = run(tmp, f"synthetic-{mode}-c{c}", model="synthetic", mode=mode, min_resource=1, max_resource=max_r, eta=3,
                        seed=0, concurrency=c, unit_seconds=args.unit_seconds)
                rows.append((f"synthetic {args.unit_seconds}s/unit", mode, c, r))
                print(f"   synthetic {mode} c={c}: {r['wall']:.1f} s", flush=True)
        if args.xgboost:
            for c in sorted({1, cores}):
                r = run(tmp, f"xgboost-c{c}", model="xgboost", data="bank-marketing", mode="hyperband", min_resource=1,
                        max_resource=max_r, eta=3, seed=0, concurrency=c, workers=1)
                rows.append(("xgboost, workers 1", "hyperband", c, r))
                print(f"   xgboost hyperband c={c}: {r['wall']:.1f} s", flush=True)

    base = {(obj, mode): r["wall"] for obj, mode, c, r in rows if c == 1}
    out = []
    for obj, mode, c, r in rows:
        speedup = base[(obj, mode)] / r["wall"] if (obj, mode) in base else float("nan")
        out.append((obj, mode, c, r["wall"], r["train"], r["train"] / c, speedup, speedup / c, r["units"]))
    print()
    print(common.table(out, ["objective", "mode", "concurrency", "wall s", "train s (sum)", "ideal wall s",
                             "speed-up vs c=1", "efficiency", "units"]))
    print(json.dumps({"bench": "scaling", "max_resource": max_r, "unit_seconds": args.unit_seconds,
                      "rows": [{"objective": o, "mode": m, "concurrency": c, **r} for o, m, c, r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
