"""Efficiency of the XGBoost job: its wall time versus the same training done back to back in one process.

1. Runs the real ``tune`` flow: XGBoost on bank-marketing, Hyperband (r=1, R=27, η=3), random
   sampler, concurrency auto (``os.cpu_count()`` trials at once, 1 thread each on this machine),
   baseline off, registration off, MLflow to a fresh sqlite store, on a temporary Prefect server.
2. Reads the job's state file (``<job_dir>/state.json``) and replays every
   trial-rung it trained with ``XGBoostTrainer`` directly, in one process, one after another:
   bracket by bracket, rung by rung, each promoted trial resuming from the checkpoint the replay
   wrote at its previous rung (as the job does), then evaluating on the validation set. The
   replay trainer uses every core (``nthread = os.cpu_count()``), the natural sequential baseline.
   Data loading (the split) is timed in the loop too, as the job loads it as well. Imports are timed in
   neither: a small XGBoost job (R=3) runs first in the same process, untimed, so the timed job does not
   pay the process's first imports (scikit-learn's alone is ~1.3 s) and flow registration, which the
   loop, run after it in the same process, never pays either.
   Then the job's own ``Loop`` and scheduler (same seed) with the trainer called inline, no Prefect, no MLflow:
   the cost of our scheduling code over the plain loop (``job_loop``).
   Then the floor: the same replay with the job's MLflow writes and with train and evaluate as Prefect task
   runs in a flow run (``replay(tracking_uri=..., tasks=True)``), one after another: the cost of the issue's
   requirements (task runs in the UI, a child run per trial with per-step metrics) before the job's own code.
3. Prints wall(job) / wall(loop), the job's summed train and eval seconds, and checks that the
   replay reproduces the job's scores (resume is seeded per milestone, so it should, bit for bit).

Run from the repository root::

    python benchmarks/bench_efficiency.py          # R=27: 69 trial-rungs, 357 units (~3 min on 2 cores)
    python benchmarks/bench_efficiency.py --quick  # R=9: 22 trial-rungs, 69 units (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def read_job(job_dir: str | Path) -> list[dict[str, Any]]:
    """Every trial-rung of the job's state file, with its trial's config: [{trial_id, bracket, rung, resource, config, score, ...}]."""
    raw = json.loads(Path(job_dir, "state.json").read_text())
    trials = {t: v for b in raw["scheduler"]["brackets"].values() for t, v in b["trials"].items()}
    return [{**row, "config": trials[row["trial_id"]]["config"]} for row in raw["rows"]]


def _as_tasks(trainer: Any) -> tuple[Any, Any]:
    """The trainer's train and evaluate as Prefect tasks (no cache, as the job's), called with values."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    @task(name="train", cache_policy=NO_CACHE)
    def train(config: dict[str, Any], resource: int, checkpoint: str | None, path: str) -> Any:
        return trainer.train(config, resource, checkpoint, path)

    @task(name="evaluate", cache_policy=NO_CACHE)
    def evaluate(checkpoint: str) -> float:
        return trainer.evaluate(checkpoint)

    return train, evaluate


def replay(rows: list[dict[str, Any]], seed: int, min_r: int, max_r: int, eta: int, out: Path,
           nthread: int | None = None, rounds_per_unit: int = 10, tracking_uri: str | None = None,
           tasks: bool = False) -> dict[str, Any]:
    """Train and evaluate the job's trial-rungs back to back; resume each trial from its previous checkpoint.
    Returns ``wall`` (loading the data included), ``setup`` (that loading), ``loop`` (the trial-rungs alone,
    without the data or the flow run around them, as a job's ``wall_seconds``), and what was trained.

    ``tracking_uri``: also make the job's MLflow writes, as the job makes them, one after another: a parent run,
    a child run per trial when it first trains, one ``log_batch`` per trial-rung (the trial's params with its
    first; a trial-rung at R with its close's tags, ``records.close_tags``), and at the end each child run's end,
    the status tags first for a run that has none yet. ``tasks``: train and evaluate are Prefect
    task runs (called with values, inside a flow run), as in the job. With both, what is left of the job is its
    own code: the driver, the state file, the promote tasks, the progress artifact."""
    from prefect_hyperband.hyperband import schedule
    from prefect_hyperband.tracking import runs as tracking
    from prefect_hyperband.tracking.records import close_tags
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    datasets._load_cached.cache_clear()  # the loop pays for loading the data, as the job does
    began = time.perf_counter()
    trainer = XGBoostTrainer(datasets.DataSpec(seed=seed), workers=1, seed=seed, rounds_per_unit=rounds_per_unit,
                             milestones=schedule.milestones(min_r, max_r, eta), nthread=nthread)
    parent = tracking.start_parent(tracking_uri, "replay", "replay", {"seed": seed}, {}) if tracking_uri else None
    setup = time.perf_counter() - began
    train, evaluate = _as_tasks(trainer) if tasks else (trainer.train, trainer.evaluate)

    def loop() -> dict[str, Any]:
        entered = time.perf_counter()
        held: dict[str, str] = {}  # trial id -> its latest checkpoint
        runs: dict[str, str] = {}  # trial id -> its child run
        tagged: set[str] = set()  # trials whose result at R brought their close's tags
        scores: dict[tuple[str, int], float] = {}
        train_s = eval_s = 0.0
        units = 0
        for row in sorted(rows, key=lambda r: (-r["bracket"], r["rung"], r["trial_id"])):
            t, resource = row["trial_id"], row["resource"]
            first = t not in held
            path = out / t / f"r{resource}.ubj"
            path.parent.mkdir(parents=True, exist_ok=True)
            if parent is not None and first:  # its run is created as it starts training, as the job does
                runs[t] = tracking.create_child(tracking_uri, parent, t, {"hyperband.trial_id": t, "hyperband.status": "running"})
            a = time.perf_counter()
            trained = train(row["config"], resource, held.get(t), str(path))
            b = time.perf_counter()
            scores[(t, resource)] = score = evaluate(trained.checkpoint)
            eval_s += time.perf_counter() - b
            train_s += b - a
            units += trained.resource_trained
            held[t] = trained.checkpoint
            if parent is not None:
                params = {**row["config"], "trial_id": t, "bracket": row["bracket"]} if first else None
                closing = close_tags(row["rung"], resource, "completed") if resource >= max_r else None
                tracking.log_result(tracking_uri, runs[t], trained.history,
                                    {"auc": score, "train_seconds": trained.seconds}, resource, params, closing)
                if closing:
                    tagged.add(t)
        for t, run_id in runs.items():  # the job closes a run when the trial's fate is decided
            if t not in tagged:
                tracking.set_tags(tracking_uri, run_id, {"hyperband.status": "completed", "hyperband.resource": str(max_r)})
            tracking.end_run(tracking_uri, run_id, "FINISHED")
        return {"train": train_s, "eval": eval_s, "units": units, "scores": scores, "loop": time.perf_counter() - entered}

    if tasks:
        from prefect import flow

        result = flow(name="replay")(loop)()
    else:
        result = loop()
    wall = time.perf_counter() - began
    trainer.close()
    return {"wall": wall, "setup": setup, **result}


class _Inline:
    """An ``Executor`` that trains each trial-rung as it is submitted, one after another: the loop, no threads."""

    def __init__(self, work: Any) -> None:
        self.work = work

    def submit(self, trial_rung: Any) -> Any:
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(self.work(trial_rung))
        return future

    def began(self, future: Any) -> float:
        return 0.0

    def give_up(self, future: Any) -> None: ...
    def interrupt(self) -> None: ...
    def shutdown(self, wait: bool) -> None: ...


class _Unrecorded:
    """A ``Tracker`` that records nothing: the result enters the state at once."""

    def start(self, trial_rung: Any) -> None: ...
    def close(self, trial_ids: list[str]) -> None: ...
    def drain(self) -> None: ...

    def record(self, out: Any) -> Any:
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(out)
        return future

    def record_failure(self, out: Any) -> Any:
        return out


class _Silent:
    def settled(self, out: Any, decisions: list) -> None: ...
    def warning(self, message: str) -> None: ...


def job_loop(params: Any, out: Path, nthread: int | None = None) -> dict[str, Any]:
    """The job's own loop (``executors.loop.Loop`` over the job's scheduler, same seed) with the trainer called inline:
    no Prefect, no MLflow, no threads. What it adds to the plain loop is the cost of our scheduling code."""
    from prefect_hyperband.executors.loop import Loop, Outcome
    from prefect_hyperband.executors.schedulers import make_scheduler
    from prefect_hyperband.executors.threads import RealClock
    from prefect_hyperband.flows.prepare import prepare
    from prefect_hyperband.hyperband import schedule
    from prefect_hyperband.trainers import data as datasets
    from prefect_hyperband.trainers.base import Evaluation
    from prefect_hyperband.trainers.stopping import StopToken
    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    job = prepare(params)  # untimed: its checks (the tracking store's, too) are the job's, not the loop's
    datasets._load_cached.cache_clear()  # it loads the data, as the job does
    began = time.perf_counter()
    trainer = XGBoostTrainer(datasets.DataSpec(seed=params.seed), workers=1, seed=params.seed,
                             rounds_per_unit=params.rounds_per_unit, nthread=nthread,
                             milestones=schedule.milestones(params.min_resource, params.max_resource, params.eta))
    plan = schedule.plan_summary(params.min_resource, params.max_resource, params.eta)
    scheduler = make_scheduler(job, plan["configs"], None, time.monotonic)

    def work(trial_rung: Any) -> Any:
        path = out / trial_rung.trial_id / f"r{trial_rung.resource}.ubj"
        path.parent.mkdir(parents=True, exist_ok=True)
        trained = trainer.train(trial_rung.config, trial_rung.resource, trial_rung.checkpoint, str(path))
        t0 = time.perf_counter()
        score = trainer.evaluate(trained.checkpoint)
        return Outcome(trial_rung, trained, Evaluation(score, time.perf_counter() - t0), None)

    run = Loop(scheduler, _Inline(work), _Unrecorded(), RealClock(), StopToken(), _Silent(),
               save=lambda *_, **__: None, concurrency=1).run()
    trainer.close()
    rows = run.rows
    return {"wall": time.perf_counter() - began, "train": sum(r["train_seconds"] for r in rows),
            "eval": sum(r["eval_seconds"] for r in rows), "units": sum(r["resource_trained"] for r in rows),
            "scores": {(r["trial_id"], r["resource"]): r["score"] for r in rows}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R=9 instead of R=27")
    parser.add_argument("--max-resource", type=int, help="override R")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=0, help="the job's concurrency (0: auto)")
    args = parser.parse_args(argv)
    min_r, eta, seed = 1, 3, args.seed
    max_r = args.max_resource or (9 if args.quick else 27)

    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.hyperband import schedule

    plan = schedule.plan_summary(min_r, max_r, eta)
    concurrency = TuneParams(concurrency=args.concurrency).trial_concurrency()
    common.header(f"bench_efficiency: XGBoost bank-marketing, Hyperband (r={min_r}, R={max_r}, eta={eta}), concurrency {concurrency}")
    print(f"   {plan['configs']} configs, {plan['trial_rungs']} trial-rungs, {plan['resource_used']} units of 10 rounds", flush=True)

    with common.workdir("efficiency") as tmp:
        with common.prefect_server():
            from prefect_hyperband.tracking import store as mlflow_store

            uri = f"sqlite:///{tmp}/mlflow.db"
            mlflow_store.check_reachable(uri)
            common.run_tune(model="xgboost", data="bank-marketing", max_resource=3, job_dir=str(tmp / "warm"),
                            tracking_uri=f"sqlite:///{tmp}/warm.db", register_model=False, baseline=False)  # imports, not timed
            from prefect_hyperband.trainers import data as datasets

            datasets._load_cached.cache_clear()  # the job loads and splits the data, as the loop does
            result, job_wall = common.run_tune(
                model="xgboost", data="bank-marketing", min_resource=min_r, max_resource=max_r, eta=eta, seed=seed,
                concurrency=args.concurrency, job_dir=str(tmp / "jobs"), job_id="efficiency", tracking_uri=uri,
                experiment="bench-efficiency", register_model=False, baseline=False,
            )
            print(f"   job: {job_wall:.1f} s", flush=True)
            rows = read_job(result["job_dir"])
            floor_uri = f"sqlite:///{tmp}/floor.db"
            mlflow_store.check_reachable(floor_uri)  # creates the store, untimed
            floor = replay(rows, seed, min_r, max_r, eta, tmp / "floor", nthread=os.cpu_count(), tracking_uri=floor_uri,
                           tasks=True)
            print(f"   loop + MLflow writes + task runs ({os.cpu_count()} threads): {floor['wall']:.1f} s", flush=True)
        summary = result["summary"]
        loop = replay(rows, seed, min_r, max_r, eta, tmp / "replay", nthread=os.cpu_count())
        print(f"   loop ({os.cpu_count()} threads): {loop['wall']:.1f} s", flush=True)
        loop1 = replay(rows, seed, min_r, max_r, eta, tmp / "replay1", nthread=1)
        print(f"   loop (1 thread): {loop1['wall']:.1f} s", flush=True)
        ours = job_loop(TuneParams(model="xgboost", data="bank-marketing", min_resource=min_r, max_resource=max_r,
                                   eta=eta, seed=seed, job_dir=str(tmp / "ours"), job_id="ours",
                                   tracking_uri=f"sqlite:///{tmp}/ours.db", baseline=False),
                        tmp / "ours-ckpt", nthread=os.cpu_count())
        print(f"   the job's Loop, trainer inline ({os.cpu_count()} threads): {ours['wall']:.1f} s", flush=True)

    job_train = sum(r["train_seconds"] for r in rows)
    job_eval = sum(r["eval_seconds"] for r in rows)
    table = [
        ("tune flow (Prefect + MLflow)", job_wall, job_train, job_eval, sum(r["resource_trained"] for r in rows), len(rows), job_wall / loop["wall"]),
        (f"plain loop, nthread={os.cpu_count()}", loop["wall"], loop["train"], loop["eval"], loop["units"], len(rows), 1.0),
        (f"the job's Loop + scheduler, inline, nthread={os.cpu_count()}", ours["wall"], ours["train"], ours["eval"],
         ours["units"], len(ours["scores"]), ours["wall"] / loop["wall"]),
        (f"+ MLflow writes + task runs, nthread={os.cpu_count()}", floor["wall"], floor["train"], floor["eval"], floor["units"],
         len(rows), floor["wall"] / loop["wall"]),
        ("plain loop, nthread=1", loop1["wall"], loop1["train"], loop1["eval"], loop1["units"], len(rows), loop1["wall"] / loop["wall"]),
    ]
    print()
    print(common.table(table, ["run", "wall s", "train s (sum)", "eval s (sum)", "units", "trial-rungs", "x loop"]))
    print()
    print(f"wall(job) / wall(loop, {os.cpu_count()} threads) = {job_wall / loop['wall']:.2f}")
    print(f"wall(job) / wall(loop, 1 thread)  = {job_wall / loop1['wall']:.2f}")
    print(f"wall(job) / wall(loop + MLflow writes + task runs, {os.cpu_count()} threads) = {job_wall / floor['wall']:.2f} "
          f"(the floor: wall(loop + MLflow + tasks) / wall(loop) = {floor['wall'] / loop['wall']:.2f})")
    print(f"job: {summary['wall_seconds']:.1f} s wall in the flow, {summary['worker_seconds']:.1f} worker-seconds of training, "
          f"{job_wall - summary['worker_seconds'] / concurrency:.1f} s more than its training divided over {concurrency} slots")
    mismatches = {}
    for label, run in ((f"nthread={os.cpu_count()}", loop), ("nthread=1", loop1), ("the job's Loop", ours)):
        mismatches[label] = [
            (r["trial_id"], r["resource"], r["score"], run["scores"][(r["trial_id"], r["resource"])])
            for r in rows if r["score"] is None or abs(r["score"] - run["scores"][(r["trial_id"], r["resource"])]) > 1e-12
        ]
        print(f"replay ({label}) reproduces the job's scores: {len(rows) - len(mismatches[label])}/{len(rows)} equal; "
              f"best val AUC job {summary['best_score']:.6f}, replay {max(run['scores'].values()):.6f}")
    mismatch = mismatches["nthread=1"]
    print(json.dumps({"bench": "efficiency", "max_resource": max_r, "job_wall": job_wall, "loop_wall": loop["wall"],
                      "loop1_wall": loop1["wall"], "floor_wall": floor["wall"], "job_loop_wall": ours["wall"], "ratio": job_wall / loop["wall"], "mismatches": len(mismatch)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
