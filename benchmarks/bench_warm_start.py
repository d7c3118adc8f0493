"""Benchmark 5: warm versus cold trial start, for DDP (PyTorch) and for XGBoost on Dask.

Run from the repository root::

    python benchmarks/bench_warm_start.py            # 5 trials per arm
    python benchmarks/bench_warm_start.py --quick    # 3 trials per arm

What is measured (all in this run, so the ratios compare like with like on a noisy machine):

* DDP, digits, 2 ranks, one-epoch trials. Cold (``warm=False``): every trial launches
  ``torch.distributed.run``, imports torch, joins the process group and loads the data. Warm (the
  default): one pool is launched by the first trial and reused. Start cost of a trial = its wall
  time minus the time spent in epochs (``info["train_seconds"]``, validation included); the
  ranks' own ``startup_seconds + setup_seconds`` are shown beside it.
* XGBoost, bank-marketing, Dask LocalCluster of 2 workers, one-unit (10-round) trials. Cold: every
  trial starts a cluster, puts the training data on it, trains, and closes it. Warm: one trainer
  (cluster and data set up once) trains every trial. Start cost = wall of a 1-unit trial minus
  the cost of the unit itself, estimated on the warm trainer as (wall of 3 units - wall of 1)/2.
  The CSV parse is cached per process, so the cold figure leaves it out (cold is understated).

The warm figures are steady-state: the trial that launches a pool is reported separately.
SageMaker's tuner reports a 20x cut in trial start time from reusing instances.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SAGEMAKER_RATIO = 20.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_ddp(trials: int, out: Path) -> dict[str, float]:
    """Per-trial wall and start cost of one-epoch DDP trials, cold and warm."""
    from prefect_hyperband.executors.torch_pool import warm_pools
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    spec = DataSpec("digits")
    rows: dict[str, list[float]] = {k: [] for k in ("cold_wall", "cold_start", "cold_ranks", "warm_wall", "warm_start", "warm_ranks")}
    cold = TorchTrainer(spec, workers=2, warm=False)
    for i in range(trials):
        began = time.perf_counter()
        r = cold.train({"seed": i}, 1, None, str(out / f"cold{i}.pt"))
        wall = time.perf_counter() - began
        rows["cold_wall"].append(wall)
        rows["cold_start"].append(wall - r.info["train_seconds"])
        rows["cold_ranks"].append(r.info["startup_seconds"] + r.info["setup_seconds"])
    warm = TorchTrainer(spec, workers=2, warm=True, pools=warm_pools)
    first: dict[str, float] = {}
    try:
        for i in range(trials + 1):  # the first one launches the pool
            began = time.perf_counter()
            r = warm.train({"seed": i}, 1, None, str(out / f"warm{i}.pt"))
            wall = time.perf_counter() - began
            if i == 0:
                first = {"wall": wall, "start": wall - r.info["train_seconds"]}
                continue
            rows["warm_wall"].append(wall)
            rows["warm_start"].append(wall - r.info["train_seconds"])
            rows["warm_ranks"].append(r.info["startup_seconds"] + r.info["setup_seconds"])
    finally:
        warm.close()
    result = {k: _median(v) for k, v in rows.items()}
    result.update({"first_wall": first["wall"], "first_start": first["start"]})
    return result


def bench_xgboost(trials: int, out: Path) -> dict[str, float]:
    """Per-trial wall and start cost of one-unit XGBoost-on-Dask trials, cold and warm."""
    from prefect_hyperband.executors.dask_xgboost import xgboost_on
    from prefect_hyperband.trainers.data import DataSpec, load
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_CONFIG
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    spec = DataSpec("bank-marketing")
    load(spec)  # parse the CSV once, outside every timing
    cold_wall, cold_setup, cold_close = [], [], []
    for i in range(trials):
        began = time.perf_counter()
        trainer = XGBoostTrainer(spec, workers=2, placement=xgboost_on(None))
        set_up = time.perf_counter() - began
        try:
            trainer.train(DEFAULT_CONFIG, 1, None, str(out / f"cold{i}.json"))
        finally:
            closing = time.perf_counter()
            trainer.close()
        cold_wall.append(time.perf_counter() - began)
        cold_setup.append(set_up)
        cold_close.append(time.perf_counter() - closing)
    began = time.perf_counter()
    warm = XGBoostTrainer(spec, workers=2, placement=xgboost_on(None))
    first_setup = time.perf_counter() - began
    one, three = [], []
    try:
        for i in range(trials):
            began = time.perf_counter()
            warm.train(DEFAULT_CONFIG, 1, None, str(out / f"warm{i}.json"))
            one.append(time.perf_counter() - began)
            began = time.perf_counter()
            warm.train(DEFAULT_CONFIG, 3, None, str(out / f"warm3-{i}.json"))
            three.append(time.perf_counter() - began)
    finally:
        warm.close()
    unit = max(0.0, (_median(three) - _median(one)) / 2)
    return {
        "cold_wall": _median(cold_wall),
        "cold_setup": _median(cold_setup),
        "cold_close": _median(cold_close),
        "cold_start": _median(cold_wall) - unit,
        "warm_wall": _median(one),
        "warm_start": max(_median(one) - unit, 1e-3),
        "unit": unit,
        "first_setup": first_setup,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 trials per arm instead of 5")
    parser.add_argument("--trials", type=int, default=None, help="trials per arm (overrides --quick)")
    args = parser.parse_args(argv)
    trials = args.trials or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        out = Path(tmp)
        (out / "ddp").mkdir()
        (out / "xgb").mkdir()
        ddp = bench_ddp(trials, out / "ddp")
        xgb = bench_xgboost(trials, out / "xgb")

    print("\n(the 'got rank' lines above are XGBoost's Dask tracker)")
    print(f"\nBenchmark 5: warm versus cold trial start ({trials} trials per arm, medians, seconds)\n")
    header = f"{'trainer':<28}{'mode':<7}{'trial wall':>11}{'start cost':>12}{'  detail'}"
    print(header)
    print("-" * (len(header) + 40))
    print(f"{'DDP digits, 2 ranks, 1 ep':<28}{'cold':<7}{ddp['cold_wall']:>11.3f}{ddp['cold_start']:>12.3f}"
          f"  ranks' startup+setup {ddp['cold_ranks']:.3f}")
    print(f"{'':<28}{'warm':<7}{ddp['warm_wall']:>11.3f}{ddp['warm_start']:>12.3f}"
          f"  ranks' startup+setup {ddp['warm_ranks']:.3f}; pool launch trial {ddp['first_wall']:.3f}"
          f" (start {ddp['first_start']:.3f})")
    print(f"{'XGBoost Dask, 2 workers, 1u':<28}{'cold':<7}{xgb['cold_wall']:>11.3f}{xgb['cold_start']:>12.3f}"
          f"  cluster + data on it {xgb['cold_setup']:.3f}, cluster shutdown {xgb['cold_close']:.3f}")
    print(f"{'':<28}{'warm':<7}{xgb['warm_wall']:>11.3f}{xgb['warm_start']:>12.3f}"
          f"  one unit ~{xgb['unit']:.3f}; set-up once per job {xgb['first_setup']:.3f}")
    print()
    for name, r in (("DDP", ddp), ("XGBoost/Dask", xgb)):
        start_ratio = r["cold_start"] / r["warm_start"]
        wall_ratio = r["cold_wall"] / r["warm_wall"]
        verdict = "meets" if start_ratio >= SAGEMAKER_RATIO else "below"
        print(f"{name:<13} cold/warm start cost {start_ratio:7.1f}x  ({verdict} SageMaker's {SAGEMAKER_RATIO:.0f}x);"
              f"  per-trial wall {wall_ratio:5.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
