"""Two objectives, quality and prediction latency: our Hyperband job against Optuna's NSGA-II at equal worker-seconds.

XGBoost on bank-marketing, objectives ``val_auc`` (max) and ``predict_ms`` (min: milliseconds to predict
1,000 validation rows, the booster loaded, one thread), the default XGBoost space, the seed's split. Per seed:

* ``hyperband``: the real ``tune`` flow, (r=1, R, η=3), ``--metric val_auc:max --metric predict_ms:min``
  (promotion by non-dominated sorting and crowding distance), baseline and registration off; its front is
  every trial at the highest rung it reached; its cost the summary's worker-seconds (train + evaluate).
* ``optuna NSGA-II``: Optuna's ``NSGAIISampler`` (its default population), each trial trained to R with the
  same ``XGBoostTrainer`` (one thread, as the job's trials at concurrency 2 on 2 cores) and measured by the same
  ``measure`` (AUC and ``predict_ms``); no pruning (Optuna's pruners take one value). It runs trials until its
  worker-seconds (train + evaluate, measured the same way) reach the job's.

Both fronts' hypervolumes are computed against one reference point per seed: each objective's worst value
over both methods' points, 10% of its range beyond (``hyperband.front.reference``). Printed per seed and as
means: hypervolume, worker-seconds, trials, front size; the target is ours >= NSGA-II's mean hypervolume at no
more worker-seconds. Run from the repository root::

    python benchmarks/bench_multi_objective.py            # 3 seeds, R=81 (~8 min on 2 cores)
    python benchmarks/bench_multi_objective.py --quick    # 3 seeds, R=27
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import bench_quality as quality  # noqa: E402

DIRECTIONS = ("max", "min")


def run_ours(seed: int, max_r: int, tmp: Path) -> dict[str, Any]:
    from prefect_hyperband.hyperband import front
    from prefect_hyperband.hyperband.bracket import BracketState
    from prefect_hyperband.hyperband.scheduler import TrialRecord

    result, wall = common.run_tune(
        max_resource=max_r, eta=3, seed=seed, metric=["val_auc:max", "predict_ms:min"], baseline=False,
        register_model=False, job_dir=str(tmp / "jobs"), job_id=f"mo-{seed}", experiment=f"mo-{seed}",
        tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    raw = json.loads(Path(result["job_dir"], "state.json").read_text())["scheduler"]
    states = [BracketState.from_json(b) for b in raw["brackets"].values()]
    records = [TrialRecord(t, v.bracket, v.config, v.status, v.rung, v.resource, st.scores(t))
               for st in states for t, v in st.trials.items()]
    points = front.points(records, DIRECTIONS)
    summary = result["summary"]
    return {"points": [p.values for p in points], "front": [p.values for p in points if p.front == 0],
            "worker_seconds": summary["worker_seconds"], "trials": summary["configs"], "wall": wall}


def run_nsga2(seed: int, max_r: int, budget: float, tmp: Path) -> dict[str, Any]:
    import optuna

    from prefect_hyperband.hyperband import pareto
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trainer = XGBoostTrainer(datasets.DataSpec(seed=seed), workers=1, seed=seed, nthread=1)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.NSGAIISampler(seed=seed))
    spent, points, began = 0.0, [], time.perf_counter()
    while spent < budget:
        trial = study.ask()
        config = quality.suggest(trial, DEFAULT_SPACE)
        t0 = time.perf_counter()
        trained = trainer.train(config, max_r, None, str(tmp / f"nsga-{seed}-{trial.number}.ubj"))
        auc, extra = trainer.measure(trained.checkpoint)
        spent += time.perf_counter() - t0
        study.tell(trial, [auc, extra["predict_ms"]])
        points.append((auc, extra["predict_ms"]))
    ranks = pareto.front_ranks(dict(enumerate(points)), DIRECTIONS)
    trainer.close()
    return {"points": points, "front": [p for i, p in enumerate(points) if ranks[i] == 0], "worker_seconds": spent,
            "trials": len(points), "wall": time.perf_counter() - began}


def main() -> None:
    from prefect_hyperband.hyperband import front, pareto

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-resource", type=int, default=81)
    ap.add_argument("--quick", action="store_true", help="R=27")
    args = ap.parse_args()
    max_r = 27 if args.quick else args.max_resource
    seeds = [int(s) for s in args.seeds.split(",")]
    common.header(f"two objectives (val_auc max, predict_ms min): hyperband (1, {max_r}, 3) vs NSGA-II, same worker-seconds")
    rows, ours_hv, theirs_hv, ours_ws, theirs_ws = [], [], [], [], []
    with common.prefect_server():
        for seed in seeds:
            with common.workdir(f"mo-{seed}") as tmp:
                ours = run_ours(seed, max_r, tmp)
                theirs = run_nsga2(seed, max_r, ours["worker_seconds"], tmp)
            ref = front.reference([*ours["points"], *theirs["points"]], DIRECTIONS)
            hv = [pareto.hypervolume(m["front"], ref, DIRECTIONS) for m in (ours, theirs)]
            ours_hv.append(hv[0]), theirs_hv.append(hv[1])
            ours_ws.append(ours["worker_seconds"]), theirs_ws.append(theirs["worker_seconds"])
            ref_text = f"auc {ref[0]:.4f}, ms {ref[1]:.2f}"
            rows.append([seed, "hyperband", ours["trials"], len(ours["front"]), ours["worker_seconds"], hv[0], ref_text])
            rows.append([seed, "optuna NSGA-II", theirs["trials"], len(theirs["front"]), theirs["worker_seconds"], hv[1], ref_text])
            print(f"   seed {seed}: hyperband HV {hv[0]:.4f} ({ours['worker_seconds']:.1f} worker-s), "
                  f"NSGA-II HV {hv[1]:.4f} ({theirs['worker_seconds']:.1f} worker-s)", flush=True)
    print(common.table(rows, ["seed", "method", "trials", "front", "worker-s", "hypervolume", "reference point"]))
    m_ours, m_theirs = statistics.fmean(ours_hv), statistics.fmean(theirs_hv)
    print(f"mean hypervolume: hyperband {common.mean_sd(ours_hv)}, NSGA-II {common.mean_sd(theirs_hv)}; "
          f"ratio {m_ours / m_theirs:.3f} (target >= 1)")
    print(f"mean worker-seconds: hyperband {common.mean_sd(ours_ws, 1)}, NSGA-II {common.mean_sd(theirs_ws, 1)} "
          f"(NSGA-II stops at its first trial past the job's)")


if __name__ == "__main__":
    main()
