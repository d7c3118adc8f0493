"""Prefect's own concurrency against ours for a trial-rung's two task runs (issue 77: "where a trial-rung's
concurrency can be Prefect's own, a task runner, ``submit``, ``as_completed``, at no measured cost, use it; where it
cannot, say so with figures").

The same trial-rungs (the synthetic model, its real ``train`` and ``evaluate`` tasks, ``tasks/trials.py``) at the
same concurrency, in one flow run each, same process, same Prefect server:

* ``ours``: what a job does (``executors/threads.ThreadExecutor`` running ``flows/runner.work``): a thread per
  trial-rung in a copy of the flow run's context, the two tasks called with values, each result dropped from the
  flow run's links once used (``prefect_internals.forget_results``).
* ``prefect``: ``train_trial.submit`` then ``evaluate_trial.submit`` given the train future, on the flow's
  ``ThreadPoolTaskRunner`` (twice the concurrency of threads: an evaluate task waits for its train in a thread),
  ``prefect.futures.as_completed`` keeping ``--concurrency`` trial-rungs in flight.

Printed per way: milliseconds of wall and of CPU (this process and the server's) per trial-rung, and the results
the flow run still links at its end per trial-rung (``FlowRunContext.run_results``: held until the flow run ends,
a train result's model with them, so a job's memory grows with its trial-rungs). Ratios are prefect / ours.

Run from the repository root::

    python benchmarks/bench_task_runner.py                  # 600 trial-rungs, 4 at once, each way twice
    python benchmarks/bench_task_runner.py --quick          # 200 trial-rungs, each way once
"""

from __future__ import annotations

import argparse
import contextvars
import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def trial_rungs(n: int, prefix: str) -> list[Any]:
    from prefect_hyperband.hyperband.trial import TrialRung

    return [TrialRung(f"{prefix}-{i:05d}", 0, 0, 1, {"x": (i % 97) / 97, "y": (i % 89) / 89}, None) for i in range(n)]


def run_ours(job: Any, trainer: Any, rungs: list[Any], concurrency: int) -> dict[str, Any]:
    from prefect import flow
    from prefect.context import FlowRunContext

    from prefect_hyperband.executors.threads import ThreadExecutor
    from prefect_hyperband.flows import runner
    from prefect_hyperband.trainers.stopping import StopToken

    @flow(name="bench-ours", persist_result=False)
    def ours() -> dict[str, Any]:
        executor = ThreadExecutor(lambda tr: runner.work(job, tr, trainer), StopToken())
        waiting, flying, failed = list(rungs), set(), 0
        while waiting or flying:
            while waiting and len(flying) < concurrency:
                flying.add(executor.submit(waiting.pop(0)))
            done, flying = wait(flying, return_when=FIRST_COMPLETED)
            failed += sum(f.result().error is not None for f in done)
        return {"failed": failed, "linked": len(FlowRunContext.get().run_results)}

    return ours()


def run_prefect(job: Any, trainer: Any, rungs: list[Any], concurrency: int) -> dict[str, Any]:
    from prefect import flow
    from prefect.context import FlowRunContext
    from prefect.futures import as_completed
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect.utilities.annotations import quote

    from prefect_hyperband.tasks.trials import evaluate_trial, train_trial

    @flow(name="bench-prefect", persist_result=False, task_runner=ThreadPoolTaskRunner(max_workers=2 * concurrency))
    def prefect_way() -> dict[str, Any]:
        waiting, flying, failed = list(rungs), set(), 0
        while waiting or flying:
            while waiting and len(flying) < concurrency:
                tr = waiting.pop(0)
                trained = train_trial.submit(quote(job), quote(trainer), tr.trial_id, tr.config, tr.resource,
                                             tr.checkpoint)
                flying.add(evaluate_trial.submit(quote(job), quote(trainer), tr.trial_id, tr.resource, trained))
            done = next(as_completed(flying))
            flying.discard(done)
            done.wait()  # its final state kept on the future: ``state`` then reads no task run from the API
            failed += done.state.is_failed()
        return {"failed": failed, "linked": len(FlowRunContext.get().run_results)}

    return prefect_way()


def measure(way: str, job: Any, trainer: Any, n: int, concurrency: int, turn: int) -> dict[str, Any]:
    cpu, began = common.cpu_seconds(), time.perf_counter()
    run = run_ours if way == "ours" else run_prefect
    out = contextvars.copy_context().run(run, job, trainer, trial_rungs(n, f"{way}{turn}"), concurrency)
    wall, cpu = time.perf_counter() - began, common.cpu_seconds() - cpu
    return {"way": way, "wall": wall / n, "cpu": cpu / n, "linked_per": out["linked"] / n, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trial-rungs", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="200 trial-rungs, one turn")
    args = ap.parse_args()
    n, turns = (200, 1) if args.quick else (args.trial_rungs, args.turns)
    common.header(f"a trial-rung's task runs: ours (threads, values) vs Prefect's (submit, ThreadPoolTaskRunner), "
                  f"{n} trial-rungs, {args.concurrency} at once")
    with common.prefect_server(), common.workdir("task-runner") as tmp:
        from prefect_hyperband.flows.params import TuneParams
        from prefect_hyperband.flows.prepare import prepare
        from prefect_hyperband.trainers import factory

        job = prepare(TuneParams(model="synthetic", max_resource=1, job_dir=str(tmp / "jobs"), job_id="bench",
                                 tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", baseline=False))
        with factory.scope():
            trainer = factory.get(job.settings)
            measure("ours", job, trainer, 20, args.concurrency, 0)  # warm-up: imports, flow registration; untimed
            measure("prefect", job, trainer, 20, args.concurrency, 0)
            rows = [measure(way, job, trainer, n, args.concurrency, turn)
                    for turn in range(1, turns + 1) for way in ("ours", "prefect")]
    for r in rows:
        assert r["failed"] == 0, r
    print(common.table([(r["way"], f"{r['wall'] * 1000:.1f}", f"{r['cpu'] * 1000:.1f}", f"{r['linked_per']:.1f}")
                        for r in rows],
                       ["way", "wall ms / trial-rung", "CPU ms / trial-rung", "results linked / trial-rung"]))
    mean = {w: {k: sum(r[k] for r in rows if r["way"] == w) / turns for k in ("wall", "cpu", "linked_per")}
            for w in ("ours", "prefect")}
    print(f"prefect / ours: wall {mean['prefect']['wall'] / mean['ours']['wall']:.2f}x, "
          f"CPU {mean['prefect']['cpu'] / mean['ours']['cpu']:.2f}x; results linked until the flow run ends: "
          f"{mean['prefect']['linked_per']:.1f} vs {mean['ours']['linked_per']:.1f} per trial-rung")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
