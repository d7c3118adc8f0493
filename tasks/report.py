"""Visible progress: Prefect UI artifacts while and after a job runs, and MLflow plots on the parent run.

Plain functions (testable, raise on error) plus thin Prefect tasks the flow calls. The tasks are
best effort: a report that cannot be written logs a warning and never fails the tuning job.

Prefect artifacts (keys: lowercase letters, numbers and dashes):
  * ``hyperband-progress``    progress bar, trial-rungs done / planned, updated per rung;
  * ``hyperband-leaderboard`` table of the best trials: config, metric, resource, bracket;
  * ``hyperband-summary``     markdown: the honest-accounting table of ``hyperband.accounting``.

MLflow artifacts of the parent run:
  * ``plots/metric_vs_resource.png``   every trial's validation metric through its rungs, by bracket;
  * ``plots/best_vs_worker_seconds.png`` best-so-far against cumulative worker-seconds.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_hyperband.hyperband.accounting import RungResult, Summary, table
from prefect_hyperband.hyperband.promotion import best_key, failed
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking.store import client

PROGRESS_KEY = "hyperband-progress"
LEADERBOARD_KEY = "hyperband-leaderboard"
#: the parent MLflow run's table of the best trials (the top ``LEADERBOARD_TOP``; MLflow's runs table holds them all)
LEADERBOARD_FILE = "leaderboard.json"
#: trials on the leaderboards: the best ones, not every trial of a 10,000-trial-rung job
LEADERBOARD_TOP = 20
SUMMARY_KEY = "hyperband-summary"
PLOT_METRIC_VS_RESOURCE = "plots/metric_vs_resource.png"
PLOT_BEST_VS_WORKER_SECONDS = "plots/best_vs_worker_seconds.png"

_KEY = re.compile(r"^[a-z0-9-]+$")

Row = RungResult | Mapping[str, Any]


def _rows(rows: Iterable[Row]) -> list[RungResult]:
    """``RungResult`` rows, also from their dict form (what the bracket and ASHA subflows return)."""
    return [r if isinstance(r, RungResult) else RungResult(**r) for r in rows]


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"artifact key must be lowercase letters, numbers and dashes, got {key!r}")
    return key


# ---------------------------------------------------------------- Prefect UI artifacts


def percent(done: int, total: int) -> float:
    """``done`` of ``total`` as the bar's percent, 0 to 100."""
    if total <= 0:
        return 100.0
    return max(0.0, min(100.0, 100.0 * done / total))


def start_progress(total_trial_rungs: int, key: str = PROGRESS_KEY, description: str | None = None) -> UUID:
    """Create the job's progress bar at 0%; returns the artifact id for ``update_progress``."""
    from prefect.artifacts import create_progress_artifact

    return create_progress_artifact(
        progress=0.0,
        key=_check_key(key),
        description=description or f"Hyperband: 0 of {total_trial_rungs} trial-rungs done",
    )


def update_progress(artifact_id: UUID | str, done: int, total: int) -> None:
    """Move the progress bar to ``done`` of ``total`` trial-rungs."""
    from prefect.artifacts import update_progress_artifact

    update_progress_artifact(
        artifact_id=UUID(str(artifact_id)),
        progress=percent(done, total),
        description=f"Hyperband: {done} of {total} trial-rungs done",
    )


def leaderboard(
    rows: Iterable[Row],
    configs: Mapping[str, Mapping[str, Any]],
    metric: str,
    direction: str,
    top: int = LEADERBOARD_TOP,
    runs: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The ``top`` trials by their best evaluated score, ranked as the champion is (``promotion.sort_key`` on
    ``trial@resource``: ties by trial id, then the smaller resource); one pass over the rows and a heap of ``top``,
    once per job. ``runs`` (trial id -> MLflow child run) adds each trial's ``run_id``."""
    key = lambda r: best_key(r.trial_id, r.resource, r.score, direction)  # noqa: E731  (best_of's key)
    best: dict[str, RungResult] = {}
    for r in _rows(rows):
        if failed(r.score):
            continue
        held = best.get(r.trial_id)
        if held is None or key(r) < key(held):
            best[r.trial_id] = r
    ranked = heapq.nsmallest(top, best.values(), key=key)
    return [
        {
            "rank": i + 1,
            "trial_id": r.trial_id,
            "bracket": r.bracket,
            "resource": r.resource,
            metric: round(float(r.score), 6),  # type: ignore[arg-type]
            "config": json.dumps(dict(configs.get(r.trial_id, {})), sort_keys=True, default=str),
            **({"run_id": runs.get(r.trial_id)} if runs is not None else {}),
        }
        for i, r in enumerate(ranked)
    ]


def publish_leaderboard(
    rows: Iterable[Row],
    configs: Mapping[str, Mapping[str, Any]],
    metric: str,
    direction: str,
    top: int = LEADERBOARD_TOP,
    key: str = LEADERBOARD_KEY,
    board: list[dict[str, Any]] | None = None,
) -> UUID:
    """Table artifact of the best trials (``board``, when computed already)."""
    from prefect.artifacts import create_table_artifact

    board = leaderboard(rows, configs, metric, direction, top) if board is None else board
    return create_table_artifact(
        table=board or [{"rank": None, "trial_id": "no trial evaluated"}],
        key=_check_key(key),
        description=f"Hyperband leaderboard: top {len(board)} trials by {metric} ({direction})",
    )


def summary_markdown(summary: Summary, title: str = "Hyperband job", extra: Mapping[str, Any] | None = None) -> str:
    lines = [f"# {title}", "", "```text", table(summary), "```"]
    if extra:
        lines += ["", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def publish_summary(
    summary: Summary, title: str = "Hyperband job", extra: Mapping[str, Any] | None = None, key: str = SUMMARY_KEY
) -> UUID:
    """Markdown artifact with the summary table (and optional key/value lines, e.g. MLflow links)."""
    from prefect.artifacts import create_markdown_artifact

    return create_markdown_artifact(
        markdown=summary_markdown(summary, title, extra),
        key=_check_key(key),
        description=f"{title}: cost and gain against training every config to R",
    )


# ---------------------------------------------------------------- plots


def figure(width: float = 7.0, height: float = 4.5):
    """A pyplot-free Agg figure: safe from worker threads, nothing to close globally."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _bracket_colours(brackets: Sequence[int]) -> dict[int, Any]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    ordered = sorted(set(brackets), reverse=True)
    n = max(1, len(ordered) - 1)
    return {s: cmap(0.9 * i / n) for i, s in enumerate(ordered)}


def plot_metric_vs_resource(rows: Iterable[Row], metric: str, direction: str):
    """One line per trial through its evaluated rungs (resource on a log axis), coloured by bracket."""
    rows = [r for r in _rows(rows) if not failed(r.score)]
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    by_trial: dict[str, list[RungResult]] = {}
    for r in rows:
        by_trial.setdefault(r.trial_id, []).append(r)
    colours = _bracket_colours([r.bracket for r in rows])
    labelled: set[int] = set()
    for trial_id in sorted(by_trial):
        points = sorted(by_trial[trial_id], key=lambda r: (r.resource, r.rung))
        s = points[0].bracket
        ax.plot(
            [p.resource for p in points],
            [p.score for p in points],
            marker="o",
            markersize=3,
            linewidth=1,
            alpha=0.8,
            color=colours[s],
            label=None if s in labelled else f"bracket s={s}",
        )
        labelled.add(s)
    if rows and max(r.resource for r in rows) > min(r.resource for r in rows):
        ax.set_xscale("log")
    ax.set_xlabel("resource (units trained)")
    ax.set_ylabel(f"{metric} ({'higher' if direction == 'max' else 'lower'} is better)")
    ax.set_title(f"Validation {metric} against resource, {len(by_trial)} trials")
    if labelled:
        ax.legend(loc="best", fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def best_so_far(rows: Iterable[Row], direction: str) -> list[tuple[float, float]]:
    """(cumulative worker-seconds, best score so far) after each evaluated trial-rung, in the given order.

    Worker-seconds count as in the summary: training seconds times workers, plus evaluation seconds.
    """
    better = max if direction == "max" else min
    spent, best, out = 0.0, None, []
    for r in _rows(rows):
        spent += r.train_seconds * r.workers + r.eval_seconds
        if failed(r.score):
            continue
        best = r.score if best is None else better(best, r.score)
        out.append((spent, best))
    return out


def plot_best_vs_worker_seconds(rows: Iterable[Row], metric: str, direction: str):
    """Best-so-far (step line) and every evaluation (dots) against cumulative worker-seconds."""
    rows = _rows(rows)
    curve = best_so_far(rows, direction)
    spent, dots = 0.0, []
    for r in rows:
        spent += r.train_seconds * r.workers + r.eval_seconds
        if not failed(r.score):
            dots.append((spent, r.score))
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    if dots:
        ax.scatter([d[0] for d in dots], [d[1] for d in dots], s=10, color="0.6", label="trial-rung")
    if curve:
        ax.plot([c[0] for c in curve], [c[1] for c in curve], drawstyle="steps-post", color="C3", linewidth=2, label="best so far")
        ax.legend(loc="best", fontsize="small")
    ax.set_xlabel("cumulative worker-seconds (completion order)")
    ax.set_ylabel(metric)
    ax.set_title(f"Best {metric} so far against cost")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def log_plots(tracking_uri: str, run_id: str, rows: Iterable[Row], metric: str, direction: str) -> list[str]:
    """Both plots as PNG artifacts of ``run_id``; returns their artifact paths."""
    rows = _rows(rows)
    c = client(tracking_uri)
    logged = []
    for path, fig in (
        (PLOT_METRIC_VS_RESOURCE, plot_metric_vs_resource(rows, metric, direction)),
        (PLOT_BEST_VS_WORKER_SECONDS, plot_best_vs_worker_seconds(rows, metric, direction)),
    ):
        c.log_figure(run_id, fig, path)
        logged.append(path)
    return logged


# ---------------------------------------------------------------- one job's progress bar


# ---------------------------------------------------------------- thin Prefect tasks (best effort)


def warn_failure(what: str, exc: BaseException) -> None:
    try:
        get_run_logger().warning("%s failed (the job goes on): %s: %s", what, type(exc).__name__, exc)
    except Exception:  # outside a run context
        pass


@task(name="report progress start", cache_policy=NO_CACHE)
def report_start(total_trial_rungs: int) -> str | None:
    """Progress artifact at 0%; its id as a string (None when it could not be created): a ``ProgressBar``'s."""
    try:
        return str(start_progress(total_trial_rungs))
    except Exception as exc:
        warn_failure("progress artifact", exc)
        return None


@task(name="report results", cache_policy=NO_CACHE)
def report_results(
    rows: list[Row],
    configs: dict[str, dict[str, Any]],
    summary: Summary,
    metric: str,
    direction: str,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    title: str = "Hyperband job",
    extra: dict[str, Any] | None = None,
    runs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Leaderboard and summary artifacts in Prefect; the leaderboard table (``leaderboard.json``, the top
    ``LEADERBOARD_TOP`` trials with their child runs: ``runs``) and both plots on the MLflow parent run (when given)."""
    out: dict[str, Any] = {"leaderboard": None, "summary": None, "plots": []}
    rows = _rows(rows)
    board = leaderboard(rows, configs, metric, direction, runs=runs or {})
    try:
        out["leaderboard"] = str(publish_leaderboard(rows, configs, metric, direction, board=board))
    except Exception as exc:
        warn_failure("leaderboard artifact", exc)
    try:
        out["summary"] = str(publish_summary(summary, title, extra))
    except Exception as exc:
        warn_failure("summary artifact", exc)
    if tracking_uri and run_id:
        from prefect_hyperband.tasks.record import ends_the_job
        from prefect_hyperband.tracking.records import retrying

        try:  # the tracking server may blip: the one retry policy of MLflow writes
            if board:
                retrying(tracking.log_table, tracking_uri, run_id, board, LEADERBOARD_FILE)
                out["table"] = LEADERBOARD_FILE
        except Exception as exc:
            if ends_the_job(exc):  # at the job's end: it stops in one line (flows.ending), --resume writes these
                raise
            warn_failure("MLflow leaderboard table", exc)
        try:
            out["plots"] = retrying(log_plots, tracking_uri, run_id, rows, metric, direction)
        except Exception as exc:
            if ends_the_job(exc):
                raise
            warn_failure("MLflow plots", exc)
    return out
