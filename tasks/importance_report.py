"""Which hyperparameters mattered, where users look: the parent MLflow run and the Prefect job run.

On the parent run: a metric ``importance.<param>`` per hyperparameter (``importance.<objective>.<param>`` with several
objectives), the table ``importance.json`` and the bar chart ``plots/importance.png``; its tags say the method, the
rung and how many results. On the Prefect flow run: the same table as the ``hyperband-importance`` artifact.
"""

from __future__ import annotations

from typing import Any

from prefect_hyperband.hyperband.importance import Importance
from prefect_hyperband.tasks import tracking
from prefect_hyperband.tasks.record import retrying
from prefect_hyperband.tasks.report import _warn, figure

IMPORTANCE_KEY = "hyperband-importance"
IMPORTANCE_FILE = "importance.json"
IMPORTANCE_PLOT = "plots/importance.png"


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


def publish(found: Importance, tracking_uri: str | None, run_id: str | None) -> dict[str, Any]:
    """Best effort: a failure here is one warning line, never the job's."""
    out: dict[str, Any] = {"artifact": None, "mlflow": False}
    table = found.table()
    try:
        from prefect.artifacts import create_table_artifact

        out["artifact"] = str(create_table_artifact(
            table=table, key=IMPORTANCE_KEY,
            description=f"Which hyperparameters mattered: {found.method}, {found.results} results at r={found.resource}"))
    except Exception as exc:  # noqa: BLE001
        _warn("importance artifact", exc)
    if tracking_uri and run_id:
        try:
            retrying(tracking.log_metrics, tracking_uri, run_id, metrics(found))
            retrying(tracking.log_table, tracking_uri, run_id, table, IMPORTANCE_FILE)
            retrying(tracking.log_figure, tracking_uri, run_id, plot(found), IMPORTANCE_PLOT)
            retrying(tracking.set_tags, tracking_uri, run_id, {
                "hyperband.importance": f"{found.method}, {found.results} results at r={found.resource}"})
            out["mlflow"] = True
        except Exception as exc:  # noqa: BLE001
            _warn("MLflow importance", exc)
    return out
