"""Several objectives in MLflow: the Pareto front on the parent run, each child run's front."""

from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.states import State

from prefect_hyperband.executors.job import Job
from prefect_hyperband.hyperband import front
from prefect_hyperband.hyperband.promotion import failed
from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tasks.record import END, write_end
from prefect_hyperband.tasks.report import figure
from prefect_hyperband.tracking import runs as tracking
from prefect_hyperband.tracking.records import retrying


@task(name="log pareto front", **END)
def log_front(job: Job, records: list[TrialRecord], rows: list[dict[str, Any]], runs: dict[str, str],
              champion: str | None, points: list[front.Point]) -> dict[str, Any] | State:
    """On the parent run: the front's table (``pareto_front.json``) and plot (``pareto_front.png``), the
    ``hypervolume`` after each trial-rung (its curve) against the reference point in its tags, and the front's
    size; each child run's ``hyperband.front_rank`` (0: on the front). ``points``: the front the flow computed."""
    return write_end(job, _log_front, job, records, rows, runs, champion, points)


def _log_front(job: Job, records: list[TrialRecord], rows: list[dict[str, Any]], runs: dict[str, str],
               champion: str | None, points: list[front.Point]) -> dict[str, Any]:
    assert job.parent_run_id is not None
    names = [name for name, _ in job.objectives]
    configs = {t.trial_id: t.config for t in records}
    table = [{"trial_id": p.trial_id, "front_rank": p.front, "resource": p.resource, **dict(zip(names, p.values)),
              **{f"config.{k}": v for k, v in configs[p.trial_id].items()}} for p in points]
    results = _in_order(records, rows)
    observed = [v for _, v, _ in results if v is not None]
    ref = front.reference(observed, job.directions) if observed else ()
    curve = front.hypervolume_curve([(t, v) for t, v, _ in results], job.directions, ref) if observed else []
    uri, run_id = job.tracking_uri, job.parent_run_id
    if table:
        tracking.log_table(uri, run_id, table, "pareto_front.json")
        tracking.log_figure(uri, run_id, plot_front(points, names, champion), "pareto_front.png")
    if curve:
        tracking.log_history(uri, run_id, "hypervolume", [(i + 1, hv, at) for i, (hv, (_, _, at)) in
                                                          enumerate(zip(curve, results))])
    on_front = sum(p.front == 0 for p in points)
    tracking.log_metrics(uri, run_id, {"pareto_front_size": on_front})
    tracking.set_tags(uri, run_id, {
        "hyperband.objectives": ", ".join(f"{n}:{d}" for n, d in job.objectives),
        "hyperband.hypervolume_reference": ", ".join(f"{n}={r:.12g}" for n, r in zip(names, ref)),
        "hyperband.select": job.select,
    })
    for p in points:
        if p.trial_id in runs:
            retrying(tracking.set_tags, uri, runs[p.trial_id], {"hyperband.front_rank": p.front})
    return {"front": [p.trial_id for p in points if p.front == 0], "reference": ref,
            "hypervolume": curve[-1] if curve else None}


def _in_order(records: list[TrialRecord], rows: list[dict[str, Any]]) -> list[tuple[str, tuple[float, ...] | None, float]]:
    """Every trial-rung's values, in the order the job settled them, with when (epoch seconds)."""
    scores = {t.trial_id: t.scores for t in records}
    out = []
    for r in rows:
        value = scores.get(r["trial_id"], {}).get(r["resource"])
        at = r.get("ended") or time.time()
        out.append((r["trial_id"], None if failed(value) else tuple(value), at))  # type: ignore[arg-type]
    return out


def plot_front(points: list[front.Point], names: list[str], champion: str | None):
    """The first two objectives: every trial at its highest rung, the front highlighted, the champion starred."""
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    rest = [p for p in points if p.front > 0]
    on = sorted((p for p in points if p.front == 0), key=lambda p: p.values[0])
    ax.scatter([p.values[0] for p in rest], [p.values[1] for p in rest], s=14, color="0.7", label="dominated")
    ax.plot([p.values[0] for p in on], [p.values[1] for p in on], marker="o", color="tab:red", linewidth=1,
            label=f"Pareto front ({len(on)})")
    best = [p for p in on if p.trial_id == champion]
    if best:
        ax.scatter([best[0].values[0]], [best[0].values[1]], marker="*", s=220, color="gold", edgecolor="black",
                   zorder=5, label=f"champion {champion}")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    title = "Pareto front, each trial at its highest rung"
    ax.set_title(title if len(names) == 2 else f"{title} (first 2 of {len(names)} objectives)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig
