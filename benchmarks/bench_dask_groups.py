"""Several distributed XGBoost trials at once on one Dask cluster: wall time at concurrency 1 vs W // workers.

A LocalCluster of ``--cluster`` worker processes (1 thread each) stands in for a cluster; the real
``tune`` flow (temporary Prefect server, MLflow to a fresh sqlite store, baseline and registration off)
runs XGBoost on bank-marketing, (1, R, 3), ``--workers`` per trial, against that scheduler address:
once at concurrency 1 (one group of workers busy, the others idle, as before this change) and once at
the default, cluster // workers trials at once on disjoint worker groups. Printed: wall seconds, the
ratio, and whether both jobs found the same scores for every trial-rung (they should: every group
holds the same row partitions). On a 2-core machine the cluster's processes share 2 cores, so the
ratio shows the scheduling, not a real cluster's speed-up.

Run from the repository root::

    python benchmarks/bench_dask_groups.py            # 4 workers, --workers 2, R=9 (~2-3 min on 2 cores)
    python benchmarks/bench_dask_groups.py --quick    # R=3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R=3 instead of R=9")
    parser.add_argument("--cluster", type=int, default=4, help="Dask worker processes")
    parser.add_argument("--workers", type=int, default=2, help="workers per trial")
    parser.add_argument("--rounds-per-unit", type=int, default=5)
    args = parser.parse_args(argv)
    max_r = 3 if args.quick else 9
    common.header(f"bench_dask_groups: XGBoost (1, {max_r}, 3), {args.workers} workers per trial, "
                  f"a {args.cluster}-worker Dask cluster")
    from distributed import LocalCluster

    from prefect_hyperband.tracking import store as mlflow_store

    rows = []
    with common.workdir("dask-groups") as tmp, common.prefect_server(), LocalCluster(
        n_workers=args.cluster, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        scores = {}
        for label, concurrency in (("one trial at a time", 1), ("cluster // workers at once", 0)):
            uri = f"sqlite:///{tmp}/{concurrency}.db"
            mlflow_store.check_reachable(uri)
            result, wall = common.run_tune(
                model="xgboost", data="bank-marketing", min_resource=1, max_resource=max_r, eta=3, seed=0,
                workers=args.workers, concurrency=concurrency, dask_address=cluster.scheduler_address,
                rounds_per_unit=args.rounds_per_unit, job_dir=str(tmp / "jobs"), job_id=f"c{concurrency}",
                tracking_uri=uri, register_model=False, baseline=False,
            )
            state = json.loads((Path(result["job_dir"]) / "state.json").read_text())
            scores[label] = {(r["trial_id"], r["resource"]): r["score"] for r in state["rows"]}
            s = result["summary"]
            rows.append((label, s["concurrency"], s["wall_seconds"], wall, s["best_score"]))
            print(f"   {label}: concurrency {s['concurrency']}, flow wall {s['wall_seconds']:.1f} s", flush=True)
    base = rows[0][2]
    print()
    print(common.table([(label, c, w, e, w / base, f"{b:.6f}") for label, c, w, e, b in rows],
                       ["run", "concurrency", "flow wall s", "end to end s", "x one at a time", "best AUC"]))
    same = len(set(map(lambda d: tuple(sorted(d.items())), scores.values()))) == 1
    print(f"same score for every trial-rung in both runs: {same}")
    print(json.dumps({"bench": "dask_groups", "rows": rows, "same_scores": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
