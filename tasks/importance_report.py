"""Which hyperparameters mattered, where users look: the parent MLflow run and the Prefect job run.

On the parent run: a metric ``importance.<param>`` per hyperparameter (``importance.<objective>.<param>`` with several
objectives), the table ``importance.json`` and the bar chart ``plots/importance.png``; its tags say the method, the
rung and how many results. On the Prefect flow run: the same table as the ``hyperband-importance`` artifact. Under
ASHA they are computed while results arrive too (``Live``), the metrics a curve over the job's results.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.states import State

from prefect_hyperband.executors.job import Job
from prefect_hyperband.hyperband import space as spaces
from prefect_hyperband.hyperband.importance import MIN_RESULTS, Importance, importance
from prefect_hyperband.hyperband.importance import preload as importance_preload
from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tasks.record import END, ends_the_job, write_end
from prefect_hyperband.tasks.report import figure, warn_failure
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking.records import retrying

IMPORTANCE_KEY = "hyperband-importance"
#: ASHA: seconds between the importances computed while results arrive (``Live``)
LIVE_INTERVAL = 10.0
#: ... and at most this share of the controller's CPU: the wait grows with what the last one cost (its thread's CPU
#: seconds), as a job's results grow (PED-ANOVA on thousands of results, the chart, the MLflow and Prefect writes)
LIVE_SHARE = 0.05
IMPORTANCE_FILE = "importance.json"
IMPORTANCE_PLOT = "plots/importance.png"


@task(name="log importance", **END)
def log_importance(job: Job, records: list[TrialRecord], method: str) -> Importance | None | State:
    """Which hyperparameters mattered, at the job's end (Optuna's evaluators, ``hyperband.importance``), published on
    the parent run and the flow run (``publish``). None when the computation fails (one warning line: the job's
    results stand without it) or no rung has enough results yet (one line). MLflow not answering past its wait, or its
    disk full, is the task's ``Failed`` state (``record.write_end``)."""
    logger = get_run_logger()
    try:
        found = compute(job, records, method)
    except Exception as exc:  # noqa: BLE001  (the job's results stand without it)
        logger.warning("importance (%s) failed: %s: %s", method, type(exc).__name__, exc)
        return None
    if found is None:
        logger.info("importance: no rung has %d finished results yet", MIN_RESULTS)
        return None
    return write_end(job, _publish_end, found, job, results_in(records), retries_its_writes=True)


def _publish_end(found: Importance, job: Job, step: int) -> Importance:
    publish(found, job.tracking_uri, job.parent_run_id, step, at_the_end=True)
    return found


def compute(job: Any, records: list[Any], method: str) -> Importance | None:
    """The importances of a job's results (its scheduler's ``records()``) by ``method``; None: too few results."""
    names = [name for name, _ in job.objectives] or [job.metric_key]
    results = [(t.config, r, v) for t in records for r, v in t.scores.items()]
    return importance(spaces.parse(job.space), results, job.directions, names, method, job.seed)


def results_in(records: list[Any]) -> int:
    return sum(len(t.scores) for t in records)


def metrics(found: Importance) -> dict[str, float]:
    several = len(found.scores) > 1
    return {f"importance.{name + '.' if several else ''}{p}": v for name in found.scores
            for p, v in found.scores[name].items()}


def plot(found: Importance):
    """One horizontal bar chart per objective, parameters best first."""
    names = list(found.scores)
    height = max(2.5, 0.35 * max(len(s) for s in found.scores.values()) + 1.2)
    fig = figure(6.0 * len(names), height)
    for i, name in enumerate(names):
        ax = fig.add_subplot(1, len(names), i + 1)
        ranked = found.top(name, len(found.scores[name]))[::-1]
        ax.barh([p for p, _ in ranked], [v for _, v in ranked], color="#4c72b0")
        ax.set_xlabel("importance (sums to 1)")
        ax.set_title(f"{name}: {found.method}, {found.results} results at r={found.resource}", fontsize=9)
    fig.tight_layout()
    return fig


def publish(found: Importance, tracking_uri: str | None, run_id: str | None, step: int = 0,
            prefect: bool = True, at_the_end: bool = False) -> dict[str, Any]:
    """Best effort: a failure here is one warning line, never the job's. ``step``: the job's results so far (the
    metrics' step, so a job's importances over time are a curve in MLflow). ``prefect=False`` (while results
    arrive): MLflow only. A Prefect table artifact cannot be updated: each one is another card in the flow run's
    Artifacts tab (16 of them buried the leaderboard and the summary of a 10,000-trial-rung job), so the flow run
    gets the job's final importances only. ``at_the_end``: MLflow not answering, or its disk full, stops the job
    (``record.ends_the_job``) rather than being waited out once more by each later write of the end."""
    out: dict[str, Any] = {"artifact": None, "mlflow": False}
    table = found.table()
    if prefect:
        try:
            from prefect.artifacts import create_table_artifact

            out["artifact"] = str(create_table_artifact(
                table=table, key=IMPORTANCE_KEY, description=f"Which hyperparameters mattered: {found.method}, "
                f"{found.results} results at r={found.resource}"))
        except Exception as exc:  # noqa: BLE001
            warn_failure("importance artifact", exc)
    if tracking_uri and run_id:
        try:
            retrying(tracking.log_metrics, tracking_uri, run_id, metrics(found), step)
            retrying(tracking.log_table, tracking_uri, run_id, table, IMPORTANCE_FILE)
            retrying(tracking.log_figure, tracking_uri, run_id, plot(found), IMPORTANCE_PLOT)
            retrying(tracking.set_tags, tracking_uri, run_id, {
                "hyperband.importance": f"{found.method}, {found.results} results at r={found.resource}"})
            out["mlflow"] = True
        except Exception as exc:  # noqa: BLE001
            if at_the_end and ends_the_job(exc):
                raise
            warn_failure("MLflow importance", exc)
    return out


def preload() -> None:
    """What the importances import (Optuna's evaluators, matplotlib for the chart): about 3.6 s of one core here.
    Measured on an ASHA job of instant trials (``--concurrency 8``, 60 s): imported by the first live computation, 31 s
    in, while results came at about 28/s, Prefect's event sender fell behind and stayed behind (its queue 3,553
    events at the 60 s end, the process 493 MiB); with ``--importance none`` its queue peaked at 369 and drained."""
    importance_preload()
    figure(1.0, 1.0)  # the chart's imports, by the one function that makes the job's figures (a blank one, dropped)


class Live:
    """The importances while results arrive (ASHA, whose job has no end in sight): at most every ``interval``
    seconds and at most ``LIVE_SHARE`` of the controller's CPU (the last one's cost, in its thread's CPU seconds
    by ``cpu``, sets the next wait), computed and published on a thread of their own, one at a time, so the loop
    never waits for them. ``compute(results)`` gives an ``Importance`` or None (too few results);
    ``publish(found, step)`` writes it; ``warm()`` (``preload``) runs first, on the same thread, as the job starts."""

    def __init__(self, compute: Callable[[list[Any]], Importance | None], publish: Callable[[Importance, int], Any],
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic,
                 count: Callable[[list[Any]], int] = results_in, cpu: Callable[[], float] = time.thread_time,
                 warm: Callable[[], Any] | None = None) -> None:
        self.compute, self.publish, self.clock, self.count, self.cpu = compute, publish, clock, count, cpu
        self.interval = LIVE_INTERVAL if interval is None else interval
        self.last, self.thread, self.published, self.failed = clock(), None, 0, None
        self.cost = 0.0  # CPU seconds of the last computation and its writes
        if warm is not None:  # ``preload``, at once on the same thread: no computation starts before it is done
            self.thread = threading.Thread(target=self._warm, args=(warm,), daemon=True, name="hyperband-importance")
            self.thread.start()

    @staticmethod
    def _warm(warm: Callable[[], Any]) -> None:
        try:
            warm()
        except Exception:  # noqa: BLE001  (the computation that needs it fails, and says so in one line)
            pass

    def offer(self, results: Callable[[], list[Any]]) -> None:
        """After a result: when due and none is being computed, the job's ``results()`` (read here, on the loop's
        thread) go to a new computation."""
        wait = max(self.interval, self.cost / LIVE_SHARE)
        if self.clock() - self.last < wait or (self.thread is not None and self.thread.is_alive()):
            return
        self.last = self.clock()
        snapshot = results()
        context = contextvars.copy_context()  # the flow run's: the Prefect artifact belongs to the job's run
        self.thread = threading.Thread(target=context.run, args=(self._run, snapshot, self.count(snapshot)),
                                       daemon=True, name="hyperband-importance")
        self.thread.start()

    def _run(self, snapshot: list[Any], step: int) -> None:
        began = self.cpu()
        try:
            found = self.compute(snapshot)
            if found is not None:
                self.publish(found, step)
                self.published += 1
        except Exception as exc:  # noqa: BLE001  (the final importances, after the job, are computed again)
            self.failed = f"{type(exc).__name__}: {exc}"
        finally:
            self.cost = self.cpu() - began

    def close(self) -> None:
        """Wait for the computation in flight (the final one is published after it, not overwritten by it)."""
        if self.thread is not None:
            self.thread.join()
