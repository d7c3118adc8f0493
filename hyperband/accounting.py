"""What a job cost and gained, against training every config to R (the honest-accounting table)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RungResult:
    """One trial trained and evaluated at one rung."""

    trial_id: str
    bracket: int
    rung: int
    resource: int
    resource_trained: int
    train_seconds: float
    eval_seconds: float
    workers: int
    score: float | None
    started: float | None = None  # epoch seconds the training began and the evaluation ended (None: unknown)
    ended: float | None = None
    gpus: int = 0  # GPUs the training held (a rank per GPU; 0: the CPU)


@dataclass(frozen=True)
class Summary:
    metric: str
    configs: int
    max_resource: int
    trial_rungs: int
    failed_trials: int
    reached_max_resource: int
    best_score: float | None
    best_trial: str | None
    best_resource: int | None
    default_score: float | None
    resource_used: int
    resource_without_early_stopping: int
    worker_seconds: float
    worker_seconds_without_early_stopping: float  # estimated at the measured seconds per unit
    wall_seconds: float  # measured: the job's own wall time (across resumes)
    sequential_seconds: float  # measured: the trial-rungs' summed train + evaluate seconds
    concurrency: int = 1
    #: estimated: every config trained to R at the job's concurrency (worker-seconds estimate / concurrency)
    wall_seconds_without_early_stopping: float = 0.0
    #: measured: the longest stretch with no trial-rung training anywhere (orchestration stalls)
    longest_idle_seconds: float = 0.0
    #: measured: worker-seconds of trainings that left no result (failed, stopped, timed out, run again);
    #: part of ``worker_seconds``. A process killed outright (SIGKILL) loses its in-flight work unmeasured.
    lost_worker_seconds: float = 0.0
    #: measured: worker-seconds of the baseline, the default config trained to R (``hyperband.first.Firsts``); part of
    #: ``worker_seconds`` and of its estimate without early stopping (either job trains it)
    baseline_worker_seconds: float = 0.0
    #: several objectives: their names (the metric first), and how many configs are on the Pareto front
    objectives: tuple[str, ...] = ()
    front_size: int = 0
    #: measured: the trainings' seconds times the GPUs each held (beside ``worker_seconds``, which counts every rank)
    gpu_seconds: float = 0.0
    #: GPUs a trial-rung held (the most of any; 0: none on a GPU)
    gpus_per_trial: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarise(
    rows: Iterable[RungResult],
    *,
    metric: str,
    configs: int,
    max_resource: int,
    reached_max_resource: int,
    failed_trials: int,
    best: tuple[str, int, float] | None,
    default_score: float | None,
    wall_seconds: float,
    concurrency: int = 1,
    lost_worker_seconds: float = 0.0,
    baseline: RungResult | None = None,
) -> Summary:
    """The job's figures from its trial-rungs (``rows``) and, apart, its baseline's (``baseline``: the default config's
    training, whose metric is ``default_score``): its cost is counted."""
    rows = list(rows)
    used = sum(r.resource_trained for r in rows)
    train_ws = sum(r.train_seconds * r.workers for r in rows)
    eval_s = sum(r.eval_seconds for r in rows)
    evaluated = max(1, sum(1 for r in rows if r.score is not None))
    without = configs * max_resource
    # every config trained to R: the measured worker-seconds per unit times configs·R,
    # plus one evaluation per config at the measured seconds per evaluation
    base_ws = baseline.train_seconds * baseline.workers + baseline.eval_seconds if baseline is not None else 0.0
    estimated = (train_ws / used * without if used else 0.0) + eval_s / evaluated * configs + base_ws
    return Summary(
        metric=metric,
        configs=configs,
        max_resource=max_resource,
        trial_rungs=len(rows),
        failed_trials=failed_trials,
        reached_max_resource=reached_max_resource,
        best_score=best[2] if best else None,
        best_trial=best[0] if best else None,
        best_resource=best[1] if best else None,
        default_score=default_score,
        resource_used=used,
        resource_without_early_stopping=without,
        worker_seconds=train_ws + eval_s + lost_worker_seconds + base_ws,
        worker_seconds_without_early_stopping=estimated,
        wall_seconds=wall_seconds,
        sequential_seconds=sum(r.train_seconds + r.eval_seconds for r in rows),
        concurrency=concurrency,
        wall_seconds_without_early_stopping=estimated / max(1, concurrency),
        longest_idle_seconds=longest_idle(rows),
        lost_worker_seconds=lost_worker_seconds,
        baseline_worker_seconds=base_ws,
        gpu_seconds=sum(r.train_seconds * r.gpus for r in rows),
        gpus_per_trial=max((r.gpus for r in rows), default=0),
    )


def longest_idle(rows: Iterable[RungResult]) -> float:
    """The longest time between the first trial-rung's start and the last one's end with none running."""
    spans = sorted((r.started, r.ended) for r in rows if r.started is not None and r.ended is not None)
    gap, reach = 0.0, spans[0][1] if spans else 0.0
    for start, end in spans[1:]:
        gap = max(gap, start - reach)
        reach = max(reach, end)
    return gap


def table(s: Summary) -> str:
    """The summary in the shape of the results table of AWS's SageMaker Hyperband post."""

    def num(x: float | None, fmt: str = ".4f") -> str:
        return "n/a" if x is None else format(x, fmt)

    def ratio(a: float | None, b: float | None, better: str, worse: str) -> str:
        if not a or not b:
            return "n/a"
        return f"{b / a:.1f}x {better}" if b >= a else f"{a / b:.1f}x {worse}"

    rows = [
        ("", "baseline", "this job", "ratio"),
        (f"model quality ({s.metric})", f"{num(s.default_score)} default config", f"{num(s.best_score)} tuned", ""),
        (
            "cost (worker-seconds)",
            f"{num(s.worker_seconds_without_early_stopping, ',.1f')} every config to R (est.)",
            f"{num(s.worker_seconds, ',.1f')}",
            ratio(s.worker_seconds, s.worker_seconds_without_early_stopping, "cheaper", "dearer"),
        ),
        (
            "resource (units)",
            f"{s.resource_without_early_stopping:,} every config to R",
            f"{s.resource_used:,}",
            ratio(s.resource_used, s.resource_without_early_stopping, "fewer", "more"),
        ),
        (
            "wall time (s)",
            f"{num(s.wall_seconds_without_early_stopping, ',.1f')} every config to R, {s.concurrency} at once (est.)",
            f"{num(s.wall_seconds, ',.1f')}",
            ratio(s.wall_seconds, s.wall_seconds_without_early_stopping, "faster", "slower"),
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    footer = (
        f"{s.configs} configs, {s.trial_rungs} trial-rungs, {s.reached_max_resource} reached R={s.max_resource}, "
        f"{s.failed_trials} failed; best {s.best_trial} at r={s.best_resource}; "
        f"training {s.sequential_seconds:,.1f} s of the wall, longest idle stretch {s.longest_idle_seconds:.1f} s"
        + (f"; {s.lost_worker_seconds:,.1f} worker-s lost to failed, stopped or retried trainings"
           if s.lost_worker_seconds >= 0.05 else "")
        + (f"; the default config's training {s.baseline_worker_seconds:,.1f} worker-s, in both costs"
           if s.baseline_worker_seconds >= 0.05 else "")
        + (f"; {s.front_size} configs on the Pareto front of {', '.join(s.objectives)}" if s.objectives else "")
        + (f"; {s.gpu_seconds:,.1f} GPU-s ({s.gpus_per_trial} GPU{'s' if s.gpus_per_trial > 1 else ''} a trial-rung)"
           if s.gpus_per_trial else "")
    )
    return "\n".join([*lines, footer])
