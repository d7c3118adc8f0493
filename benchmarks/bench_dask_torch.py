"""What running torch trials on a Dask cluster or a Prefect work pool costs per trial-rung, against one machine.

The torch digits job (1, R, 3) at world size 2 (``--workers 2``: two DDP ranks per trial-rung), three ways, same
seed, same run:

* one machine: the local warm pools (rank processes kept across trial-rungs), one trial-rung at a time (the job's
  default at world size 2 on 2 cores), and two at once (two pools: the like-for-like of two Dask groups);
* a Dask cluster: a fresh ``LocalCluster`` on loopback, worker processes of 1 thread, each trial-rung's ranks as Dask
  tasks on a group (``--dask-address``): 2 workers, one group (the rank processes of one machine: the like-for-like
  overhead), then 4 workers, two groups, two trial-rungs at once;
* a Prefect work pool: a Prefect server, a process pool and 2 process workers, every trial-rung a flow run
  (``--trial-pool``, a shared ``--storage`` folder); each of its processes starts its own two ranks.

Printed per run: the flow's wall, the trial-rungs' pure training (the ranks' epoch loops, from each child run's
``train_seconds``), and the overhead per trial-rung: (flow wall x concurrency - pure training) / trial-rungs, the
slot-seconds each trial-rung cost beyond its epochs; the mean startup (dispatch to the ranks' first epoch, the
rendezvous included). Also: whether every trial-rung's score equals the one-machine job's (to 1e-6). On a 2-core machine the cluster's processes share 2 cores: this measures overheads, not a
cluster's speed-up.

Run from the repository root::

    python benchmarks/bench_dask_torch.py             # R=9: 22 trial-rungs per run (~5 min on 2 cores)
    python benchmarks/bench_dask_torch.py --no-pool   # the one-machine and Dask runs only
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
from bench_trial_pool import _tune, work_pool  # noqa: E402


def summed(uri: str, parent_run_id: str, metric: str) -> tuple[float, int]:
    """A metric of the job's child runs summed over every trial-rung (each one's step), and how many there were."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                  max_results=5000)
    values = [m.value for c in children for m in client.get_metric_history(c.info.run_id, metric)]
    return sum(values), len(values)


def pure_training(uri: str, parent_run_id: str) -> float:
    """Seconds the ranks spent in their epoch loops, summed over the job's trial-rungs (child runs' metric)."""
    return summed(uri, parent_run_id, "train_seconds")[0]


def mean_startup(uri: str, parent_run_id: str) -> float:
    """Seconds from a trial-rung's dispatch to its ranks' first epoch (the rendezvous included), on average."""
    total, n = summed(uri, parent_run_id, "startup_seconds")
    return total / max(1, n)


def scores(job_dir: str) -> dict[tuple[str, int], float]:
    rows = json.loads((Path(job_dir) / "state.json").read_text())["rows"]
    return {(r["trial_id"], r["resource"]): r["score"] for r in rows}


def pool_run(tmp: Path, flags: list[str]) -> tuple[dict, float, str]:
    """The job on a process work pool of 2 workers (a Prefect server of its own); (result, CLI wall, MLflow URI)."""
    uri = f"sqlite:///{tmp}/pool.db"
    with work_pool(tmp, 2) as env:
        result, wall = _tune(env, tmp, [*flags, "--trial-pool", "bench-pool", "--storage", str(tmp / "shared"),
                                        "--tracking-uri", uri, "--job-dir", str(tmp / "pool-jobs")])
    return result, wall, uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-resource", type=int, default=9)
    parser.add_argument("--no-pool", action="store_true", help="skip the work-pool run")
    args = parser.parse_args(argv)
    R = args.max_resource
    common.header(f"bench_dask_torch: torch digits (1, {R}, 3), world size 2: one machine vs Dask vs a work pool")
    from distributed import LocalCluster

    from prefect_hyperband.tracking import store as mlflow_store

    common_fields = dict(model="torch", data="digits", min_resource=1, max_resource=R, eta=3, seed=0, workers=2,
                         register_model=False, baseline=False)
    runs = []  # (label, result, wall end to end, MLflow URI)
    tmp = Path(tempfile.mkdtemp(prefix="bench-dask-torch-"))
    try:
        with common.prefect_server():
            uri = f"sqlite:///{tmp}/local.db"
            mlflow_store.check_reachable(uri)
            result, wall = common.run_tune(**common_fields, job_dir=str(tmp / "jobs"), job_id="local", tracking_uri=uri)
            runs.append(("one machine, warm pools", result, wall, uri))
            print(f"   one machine: flow wall {result['summary']['wall_seconds']:.1f} s", flush=True)
            uri = f"sqlite:///{tmp}/local2.db"  # two pools at once: the like-for-like of two Dask groups
            mlflow_store.check_reachable(uri)
            result, wall = common.run_tune(**common_fields, job_dir=str(tmp / "jobs"), job_id="local2", tracking_uri=uri,
                                           concurrency=2)
            runs.append(("one machine, 2 warm pools", result, wall, uri))
            print(f"   one machine, 2 at once: flow wall {result['summary']['wall_seconds']:.1f} s", flush=True)
            for workers in (2, 4):  # one group: the rank processes of one machine; two groups, two trial-rungs at once
                with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:  # a fresh cluster: the job pays its imports
                    uri = f"sqlite:///{tmp}/dask{workers}.db"
                    mlflow_store.check_reachable(uri)
                    result, wall = common.run_tune(**common_fields, job_dir=str(tmp / "jobs"), job_id=f"dask{workers}",
                                                   tracking_uri=uri, dask_address=cluster.scheduler_address)
                    runs.append((f"Dask, {workers} workers", result, wall, uri))
                    print(f"   Dask, {workers} workers: flow wall {result['summary']['wall_seconds']:.1f} s", flush=True)
        if not args.no_pool:
            flags = ["--model", "torch", "--data", "digits", "--max-resource", str(R), "--seed", "0", "--workers", "2",
                     "--no-baseline", "--no-register-model", "--concurrency", "2"]
            result, wall, uri = pool_run(tmp, flags)
            runs.append(("work pool, 2 workers", result, wall, uri))
            print(f"   work pool: flow wall {result['summary']['wall_seconds']:.1f} s", flush=True)
        rows, overheads, reference = [], [], scores(runs[0][1]["job_dir"])
        for label, result, wall, uri in runs:
            s = result["summary"]
            n, pure = s["trial_rungs"], pure_training(uri, result["parent_run_id"])
            overhead = (s["wall_seconds"] * s["concurrency"] - pure) / n
            got = scores(result["job_dir"])
            same = got.keys() == reference.keys() and all(abs(got[k] - reference[k]) <= 1e-6 for k in got)
            overheads.append(overhead)
            rows.append((label, s["concurrency"], n, wall, s["wall_seconds"], pure, overhead,
                         overhead / overheads[0], mean_startup(uri, result["parent_run_id"]), same))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(common.table(rows, ["run", "concurrency", "trial-rungs", "end to end s", "flow wall s", "pure training s",
                              "overhead s per trial-rung", "x one machine", "startup s per trial-rung",
                              "same scores"]))
    print(f"Dask overhead per trial-rung (target <= 1.3x the warm pools'): one group {overheads[2] / overheads[0]:.2f}x "
          f"one pool's; two groups at once {overheads[3] / overheads[1]:.2f}x two pools'")
    if len(overheads) == 5:
        print(f"the work pool's overhead is {overheads[4] / overheads[3]:.1f}x Dask's at the same concurrency "
              "(target >= 5x)")
    print(json.dumps({"bench": "dask_torch", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
