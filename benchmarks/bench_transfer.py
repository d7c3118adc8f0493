"""Warm start (``--warm-start``): worker-seconds a second job needs to reach a target, cold and warm, paired by seed.

Each row runs the job's own scheduler inline (synchronous Hyperband (1, R, 3), brackets in turn with TPE), one
trial-rung at a time, no Prefect and no MLflow (as ``bench_priors.py``), so what differs is only what the second
job was given:

* ``same data``: a first job (sampler seed s) on the data; then a second job (sampler seed s + 100, the same
  split) cold, and warm-started from the first as ``--warm-start`` does on the same data, model and space (the
  first job's results told to TPE, ``hyperband.warm.WarmSampler``; the brackets widest first). Target: the
  first job's best. Goal: warm at most 0.5x cold.
* ``other data``: a first job on other data of the same model (breast-cancer for digits; a resampled half of
  bank-marketing for bank-marketing); the second job warm-started from it as ``--warm-start`` does across data:
  the first job's η best configs first, clipped to the space. Target: the top-10 % of reference configs trained to
  R on the seed's split (``bench_priors.top_tenth``; the first job's best is on other data). Goal: warm at most 1.0x
  cold.

A seed that never reaches its target counts its whole job (marked ``>=``). Beside each ratio: the 90 % paired
bootstrap interval over the seeds (``bench_priors.ratio_interval``) and on how many seeds warm got there first.
Run from the repository root::

    python benchmarks/bench_transfer.py                       # both data sets, 5 seeds, R=27 (~20 min on 2 cores)
    python benchmarks/bench_transfer.py --max-resource 9 --seeds 0,1   # a quick look
    python benchmarks/bench_transfer.py --parts same --best-at-r       # only models trained to R count
    python benchmarks/bench_transfer.py --parts same --warm-order narrowest   # as --warm-start did before 2026-11-28
    python benchmarks/bench_transfer.py --parts same --continue-parents 4  # continue the first job's checkpoints
    python benchmarks/bench_transfer.py --parts same --reseed 10      # the first job's best config under 10 model seeds
    python benchmarks/bench_transfer.py --parts same --reseed 10 --target config   # that config's median as target
    python benchmarks/bench_transfer.py --rush        # RUSH's hurdles (Zappella et al. 2021), emulated, both parts
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
from bench_priors import ratio_interval, top_tenth  # noqa: E402

#: (data, metric, direction) of each problem, and of the other data its transfer job starts from
PROBLEMS = {
    "bank-marketing": (("bank-marketing", "auc", "max"), ("bank-marketing-half", "auc", "max")),
    "digits": (("digits", "logloss", "min"), ("breast-cancer", "logloss", "min")),
}


def half_of_bank_marketing(folder: str) -> str:
    """A resampled bank-marketing: half of its rows (a generator of its own), as a CSV the job reads."""
    import pandas as pd

    from prefect_hyperband.trainers import data as datasets

    source = Path(datasets.__file__).resolve().parent.parent / "data" / Path(*datasets.BANK_MARKETING)
    with gzip.open(source, "rt") as f:
        frame = pd.read_csv(f, sep=";")
    path = Path(folder) / "bank-half.csv"
    frame.sample(frac=0.5, random_state=7).drop(columns=["duration"]).to_csv(path, index=False, sep=";")
    return str(path)


def trainer_for(data: str, metric: str, seed: int, half: str):
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    spec = (datasets.DataSpec(data=half, target="y", seed=seed) if data == "bank-marketing-half"
            else datasets.DataSpec(data=data, seed=seed))
    return XGBoostTrainer(spec, workers=1, metric=metric, seed=seed, nthread=1)


#: only results at R count toward the best-so-far (``--best-at-r``: models trained to the end)
AT_R = {"on": False}


def job(trainer: Any, max_resource: int, seed: int, direction: str, warm: Callable[[Any], Any] | None = None,
        target: float | None = None, narrow_first: bool = False, keep: str | None = None,
        resumed: dict[str, str] | None = None, hurdles: dict[int, float] | None = None,
        budget: float | None = None, hints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One job inline: its results, the worker-seconds when its best-so-far first reached ``target``, its total.
    ``keep``: a folder the job's checkpoints stay in (its results then carry each one's path); ``resumed``: config
    key -> a checkpoint its first trial-rung continues from (``--continue-parents``)."""
    from prefect_hyperband.hyperband.sampler import TPESampler
    from prefect_hyperband.hyperband.scheduler import HyperbandScheduler
    from prefect_hyperband.hyperband.space import parse
    from prefect_hyperband.hyperband.warm import config_key
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

    space = parse(DEFAULT_SPACE)
    sampler = TPESampler(space, seed, direction)
    sampler = warm(sampler) if warm else sampler
    sched = HyperbandScheduler(1, max_resource, 3, direction, space, seed, sampler,
                               sequential=True, narrow_first=narrow_first)
    HURDLES["now"] = dict(hurdles or {})  # read only where --rush patched the bracket
    hint_keys = {config_key(c) for c in hints or []}
    iteration = 0
    better = (lambda a, b: a >= b) if direction == "max" else (lambda a, b: a <= b)
    spent, best, reached, results = 0.0, None, None, []
    resumed = dict(resumed or {})
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix="bench-transfer-", dir=keep)) if keep
          else tempfile.TemporaryDirectory(prefix="bench-transfer-")) as tmp:
        while True:
            if sched.done:
                if budget is None or spent >= budget or reached is not None:
                    break
                iteration += 1
                sched = HyperbandScheduler(1, max_resource, 3, direction, space, seed + 1000 * iteration, sampler,
                                           sequential=True, narrow_first=narrow_first)
            trial_rung = sched.next_trial_rung()
            start = trial_rung.checkpoint
            if start is None:
                start = resumed.pop(config_key(trial_rung.config), None)
            began = time.perf_counter()
            trained = trainer.train(trial_rung.config, trial_rung.resource, start,
                                    f"{tmp}/{trial_rung.trial_id}-r{trial_rung.resource}.ubj")
            value = trainer.evaluate(trained.checkpoint)
            spent += time.perf_counter() - began
            if config_key(trial_rung.config) in hint_keys:  # RUSH: a hint's score sets the bar at its resource
                bars = HURDLES["now"]
                old = bars.get(trial_rung.resource)
                bars[trial_rung.resource] = value if old is None or better(value, old) else old
            sched.report(trial_rung.trial_id, trial_rung.resource, value, trained.checkpoint)
            results.append((dict(trial_rung.config), trial_rung.resource, value, trained.checkpoint))
            if AT_R["on"] and trial_rung.resource != max_resource:
                continue
            best = value if best is None or better(value, best) else best
            if reached is None and target is not None and better(best, target):
                reached = spent
    trainer.close()
    HURDLES["now"] = {}
    return {"results": results, "best": best, "total": spent, "reached": reached}


#: RUSH's hurdles for the job running now (resource -> the best hint's score there; none: no hurdle)
HURDLES: dict[str, dict[int, float]] = {"now": {}}


def _patch_advance() -> None:
    """Emulate RUSH (Zappella et al. 2021) in the synchronous bracket: a promoted trial must also be at least as
    good as the hurdle at its rung's resource; a rung that promotes nobody ends its bracket."""
    from prefect_hyperband.hyperband.bracket import BracketState
    from prefect_hyperband.hyperband.promotion import sign

    original = BracketState.advance

    def advance(self):
        resource = self.current.resource
        up = original(self)
        hurdles = HURDLES["now"]
        if resource not in hurdles:
            return up
        way = sign(self.direction)
        kept = [t for t in up if way * self.results[self.rung_index - 1][t] >= way * hurdles[resource]]
        for t in up:
            if t not in kept:
                self.trials[t].status, self.trials[t].in_flight = "stopped", False
                self.trials[t].rung = self.rung_index - 1
        self.active = kept
        if not kept:
            self.rung_index = len(self.rungs)
        return kept

    BracketState.advance = advance


def hurdles_of(results: list[Any], direction: str) -> dict[int, float]:
    """The first job's best config's score at each resource it was trained to (RUSH's hint, known here)."""
    from prefect_hyperband.hyperband.warm import best_configs, config_key

    best = config_key(best_configs([r[:3] for r in results], direction, 1)[0])
    return {r: v for c, r, v, _ in results if config_key(c) == best and v is not None}


def identical(results: list[Any], max_resource: int, first: list[dict[str, Any]] | None = None
              ) -> Callable[[Any], Any]:
    from prefect_hyperband.hyperband.warm import WarmSampler

    told = [r[:3] for r in results]
    return lambda inner: WarmSampler.start(inner, told, list(first or []), max_resource, ["first"], "identical",
                                           observe=True)


def continued(results: list[Any], max_resource: int, direction: str, k: int) -> dict[str, str]:
    """The first job's ``k`` best configs stopped below R (``warm.best_configs`` of those never trained to R), each
    with its checkpoint at its highest resource: config key -> checkpoint, best first."""
    from prefect_hyperband.hyperband.warm import best_configs, config_key

    reached = {config_key(c) for c, r, _, _ in results if r >= max_resource}
    below = [r for r in results if config_key(r[0]) not in reached]
    highest = {config_key(c): p for c, _, _, p in sorted(below, key=lambda r: r[1])}  # the last, the highest
    return {config_key(c): highest[config_key(c)] for c in best_configs([r[:3] for r in below], direction, k)}


def hints_of(results: list[Any], direction: str, k: int = 3) -> list[dict[str, Any]]:
    """The other-data job's ``k`` best configs clipped to the space: what ``--warm-start`` draws first (and, with
    ``--rush``, RUSH's hints, whose scores in the new job set the hurdles)."""
    from prefect_hyperband.hyperband.space import parse
    from prefect_hyperband.hyperband.warm import best_configs, clip
    from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

    return [clip(parse(DEFAULT_SPACE), c) for c in best_configs([r[:3] for r in results], direction, k)]


def transfer(results: list[Any], direction: str, k: int = 3) -> Callable[[Any], Any]:
    from prefect_hyperband.hyperband.warm import WarmSampler

    first = hints_of(results, direction, k)
    return lambda inner: WarmSampler.start(inner, [], first, 0, ["first"], "transfer", observe=False)


def reseeded(data: str, metric: str, way: str, seed: int, half: str, first: dict[str, Any], n: int
             ) -> tuple[list[Any], float]:
    """The first job's best result trained again, the same config to the same resource on the same split, under
    ``n`` other model seeds (XGBoost's column sampling): how far the target is the config and how far its draw."""
    from prefect_hyperband.hyperband.promotion import sign

    config, resource = next((c, r) for c, r, v, _ in first["results"] if v == first["best"])
    with tempfile.TemporaryDirectory(prefix="bench-transfer-reseed-") as tmp:
        scores = []
        for k in range(1, n + 1):
            trainer = trainer_for(data, metric, seed, half)
            trainer.seed = seed + 7919 * k  # the split stays the seed's (the data's own seed)
            trained = trainer.train(config, resource, None, f"{tmp}/{k}.ubj")
            scores.append(trainer.evaluate(trained.checkpoint))
            trainer.close()
    worse = sum(sign(way) * (v - first["best"]) < 0 for v in scores)
    median = statistics.median(scores)
    return [seed, f"{first['best']:.4f}", resource, f"{min(scores):.4f}", f"{median:.4f}", f"{max(scores):.4f}",
            f"{worse} of {n}"], median


def compare(label: str, cold: list[dict[str, Any]], warm: list[dict[str, Any]], goal: float) -> None:
    cost = lambda r: r["reached"] if r["reached"] is not None else r["total"]  # noqa: E731
    c, w = [cost(r) for r in cold], [cost(r) for r in warm]
    ratio = statistics.mean(w) / statistics.mean(c)
    low, high = ratio_interval(w, c)
    first = sum(a < b for a, b in zip(w, c))
    rows = [[i, _shown(cr), _shown(wr), f"{cost(wr) / cost(cr):.2f}x"] for i, (cr, wr) in enumerate(zip(cold, warm))]
    print(common.table(rows, ["seed", "cold s", "warm s", "warm/cold"]))
    verdict = "met" if ratio <= goal else "missed"
    print(f"{label}: warm {ratio:.2f}x cold worker-seconds to the target (90% paired bootstrap {low:.2f}-{high:.2f}; "
          f"warm first on {first} of {len(c)} seeds; goal <= {goal}x): {verdict}", flush=True)


def _shown(r: dict[str, Any]) -> str:
    return f"{r['reached']:.2f}" if r["reached"] is not None else f">={r['total']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--problems", default="bank-marketing,digits")
    ap.add_argument("--max-resource", type=int, default=27, help="R (units of 10 boosting rounds)")
    ap.add_argument("--reference", type=int, default=30, help="other data: configs behind each seed's target")
    ap.add_argument("--parts", default="same,other", help="same: warm from the same data; other: from other data")
    ap.add_argument("--best-at-r", action="store_true",
                    help="only results at R count toward the best-so-far and the first job's best (the target)")
    ap.add_argument("--continue-parents", type=int, default=0, metavar="K",
                    help="same data: the warm job's first K configs are the first job's K best stopped below R, each "
                         "continued from its checkpoint there (emulated here; not what --warm-start does yet)")
    ap.add_argument("--warm-order", choices=("narrowest", "widest"), default="widest",
                    help="same data: the warm job's brackets widest first (as a cold job's, and --warm-start's since "
                         "2026-11-28) or narrowest first (as --warm-start's before)")
    ap.add_argument("--reseed", type=int, default=0, metavar="N",
                    help="same data: also train each first job's best config again under N other model seeds and "
                         "print the spread of its score around the target")
    ap.add_argument("--target", choices=("draw", "config"), default="draw",
                    help="same data: the first job's best score (draw), or the median of its best config under the "
                         "--reseed seeds (config: that config's quality, not its luckiest draw)")
    ap.add_argument("--rush", action="store_true",
                    help="RUSH's hurdles (emulated; not what --warm-start does): a promotion must also match the best "
                         "hint at its resource (same data: the first job's best config, its scores known; other data: "
                         "the configs drawn first, as scored in the new job); the warm job goes on for the cold job's "
                         "worker-seconds")
    args = ap.parse_args()
    if args.target == "config" and not args.reseed:
        ap.error("--target config needs --reseed N")
    if args.rush:
        _patch_advance()
    AT_R["on"] = args.best_at_r
    parts = args.parts.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    big = args.max_resource
    common.header(f"warm start: worker-seconds of a second job to a target, cold vs --warm-start, seeds {seeds}")
    with tempfile.TemporaryDirectory(prefix="bench-transfer-data-") as folder:
        half = half_of_bank_marketing(folder)
        for name in args.problems.split(","):
            (data, metric, way), (other, other_metric, other_way) = PROBLEMS[name]
            print(f"\nXGBoost val_{metric} on {data}, Hyperband (1, {big}, 3) with TPE", flush=True)
            cold, warm, cold_t, warm_t, gains, spread, targets = [], [], [], [], [], [], []
            for seed in seeds:
                if "same" in parts:
                    first = job(trainer_for(data, metric, seed, half), big, seed, way, keep=folder)
                    if args.reseed:
                        row, median = reseeded(data, metric, way, seed, half, first, args.reseed)
                        spread.append(row)
                        if args.target == "config":
                            first["best"] = median
                    targets.append(first["best"])
                    cold.append(job(trainer_for(data, metric, seed, half), big, seed + 100, way, None, first["best"]))
                    resumed = continued(first["results"], big, way, args.continue_parents)
                    firsts = [json.loads(key) for key in resumed]
                    warm.append(job(trainer_for(data, metric, seed, half), big, seed + 100, way,
                                    identical(first["results"], big, firsts), first["best"],
                                    narrow_first=args.warm_order == "narrowest", resumed=resumed,
                                    hurdles=hurdles_of(first["results"], way) if args.rush else None,
                                    budget=cold[-1]["total"] if args.rush else None))
                if "other" not in parts:
                    continue
                from bench_priors import reference_values

                from prefect_hyperband.trainers.xgboost.config import DEFAULT_SPACE

                target = top_tenth(reference_values(big, trainer_for(data, metric, seed, half), DEFAULT_SPACE,
                                                    args.reference, seed), way)
                elsewhere = job(trainer_for(other, other_metric, seed, half), big, seed, other_way)
                cold_t.append(job(trainer_for(data, metric, seed, half), big, seed + 100, way, None, target))
                warm_t.append(job(trainer_for(data, metric, seed, half), big, seed + 100, way,
                                  transfer(elsewhere["results"], other_way), target,
                                  hints=hints_of(elsewhere["results"], other_way) if args.rush else None,
                                  budget=cold_t[-1]["total"] if args.rush else None))
                gains.append((cold_t[-1]["best"], warm_t[-1]["best"]))
            if "same" in parts:
                what = ("the median of the first job's best config under other model seeds" if args.target == "config"
                        else f"the first job's best{' at R' if args.best_at_r else ''}")
                print(f"same data: the target is {what}: " + ", ".join(f"{t:.4f}" for t in targets))
                if spread:
                    print(f"the first job's best config trained again under {args.reseed} other model seeds:")
                    print(common.table(spread,
                                       ["seed", "its best", "at r", "min", "median", "max", "worse than its best"]))
                compare(f"{data}, warm-started from a job on the same data (brackets {args.warm_order} first)",
                        cold, warm, 0.5)
            if "other" not in parts:
                continue
            print(f"other data ({other}): the target per seed is the top-10 % of {args.reference} reference configs "
                  "at R")
            compare(f"{data}, warm-started from a job on {other}", cold_t, warm_t, 1.0)
            print("final best, cold -> warm: " + ", ".join(f"{c:.4f} -> {w:.4f}" for c, w in gains))


if __name__ == "__main__":
    main()
