"""Progress, leaderboard and summary artifacts in Prefect; plots on the MLflow parent run."""

from __future__ import annotations

import json

import pytest

from prefect_hyperband.flows import progress_bar
from prefect_hyperband.hyperband.accounting import RungResult, summarise
from prefect_hyperband.tasks import report

# bracket s=1: a, b, c at r=1, b promoted to r=3; bracket s=0: d, e at r=3 (e failed)
ROWS = [
    RungResult("s1-a", 1, 0, 1, 1, 1.0, 0.1, 2, 0.70),
    RungResult("s1-b", 1, 0, 1, 1, 1.0, 0.1, 2, 0.80),
    RungResult("s1-c", 1, 0, 1, 1, 1.0, 0.1, 2, 0.60),
    RungResult("s1-b", 1, 1, 3, 2, 2.0, 0.1, 2, 0.85),
    RungResult("s0-d", 0, 0, 3, 3, 3.0, 0.1, 2, 0.75),
    RungResult("s0-e", 0, 0, 3, 0, 0.0, 0.0, 1, None),
]
CONFIGS = {t: {"eta": 0.1 * (i + 1), "max_depth": 3 + i} for i, t in enumerate(["s1-a", "s1-b", "s1-c", "s0-d", "s0-e"])}


def _summary():
    return summarise(ROWS, metric="val_auc", configs=5, max_resource=3, reached_max_resource=2, failed_trials=1,
                     best=("s1-b", 3, 0.85), default_score=0.78, wall_seconds=5.0)


    for key in (report.PROGRESS_KEY, report.LEADERBOARD_KEY, report.SUMMARY_KEY):
        assert report._check_key(key) == key
    with pytest.raises(ValueError):
        report._check_key("Hyperband_Leaderboard")


def test_leaderboard_ranks_trials_by_their_best_score():
    board = report.leaderboard(ROWS, CONFIGS, "val_auc", "max", top=3)
    assert [r["trial_id"] for r in board] == ["s1-b", "s0-d", "s1-a"]
    assert board[0] == {"rank": 1, "trial_id": "s1-b", "bracket": 1, "resource": 3, "val_auc": 0.85,
                        "config": json.dumps(CONFIGS["s1-b"], sort_keys=True)}
    low = report.leaderboard(ROWS, CONFIGS, "val_rmse", "min")
    assert [r["trial_id"] for r in low] == ["s1-c", "s1-a", "s0-d", "s1-b"]  # the failed trial is left out
    assert low[0]["val_rmse"] == 0.6


def test_metric_vs_resource_draws_one_line_per_evaluated_trial():
    fig = report.plot_metric_vs_resource(ROWS, "val_auc", "max")
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4  # s0-e never produced a score
    points = {len(line.get_xdata()) for line in lines}
    assert points == {1, 2}
    two = [line for line in lines if len(line.get_xdata()) == 2][0]
    assert list(two.get_xdata()) == [1, 3] and list(two.get_ydata()) == [0.80, 0.85]
    assert fig.axes[0].get_xscale() == "log"
    labels = sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert labels == ["bracket s=0", "bracket s=1"]
    # same bracket, same colour; different brackets, different colours
    colour = {line.get_label(): line.get_color() for line in lines}
    assert colour["bracket s=1"] != colour["bracket s=0"]


def test_best_so_far_in_completion_order():
    curve = report.best_so_far(ROWS, "max")
    assert [round(x, 6) for x, _ in curve] == [2.1, 4.2, 6.3, 10.4, 16.5]
    assert [y for _, y in curve] == [0.70, 0.80, 0.80, 0.85, 0.85]
    assert [y for _, y in report.best_so_far(ROWS, "min")] == [0.70, 0.70, 0.60, 0.60, 0.60]
    fig = report.plot_best_vs_worker_seconds(ROWS, "val_auc", "max")
    ax = fig.axes[0]
    (line,) = ax.get_lines()
    assert len(line.get_xdata()) == 5
    assert len(ax.collections[0].get_offsets()) == 5  # one dot per evaluated trial-rung


def test_leaderboard_takes_rows_as_dicts_or_trial_rungs():
    """The state file holds rows as dicts; the summary holds ``RungResult``s: both rank the same."""
    board = report.leaderboard([r.__dict__ for r in ROWS], CONFIGS, "val_auc", "max")
    assert board == report.leaderboard(ROWS, CONFIGS, "val_auc", "max")


def test_plots_of_nothing_do_not_fail():
    assert report.plot_metric_vs_resource([], "val_auc", "max").axes[0].get_lines() == []
    assert report.plot_best_vs_worker_seconds([], "val_auc", "max").axes[0].get_lines() == []


def test_log_plots_to_the_parent_run(tracking_uri):
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri)
    run = c.create_run(c.create_experiment("plots"))
    paths = report.log_plots(tracking_uri, run.info.run_id, ROWS, "val_auc", "max")
    assert paths == [report.PLOT_METRIC_VS_RESOURCE, report.PLOT_BEST_VS_WORKER_SECONDS]
    listed = {f.path for f in c.list_artifacts(run.info.run_id, "plots")}
    assert listed == set(paths)
    local = c.download_artifacts(run.info.run_id, report.PLOT_METRIC_VS_RESOURCE)
    with open(local, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _artifacts(flow_run_id):
    """The flow run's artifacts by key, through the REST API.

    Raw request on purpose: the 3.8.8 client sends ``null`` for unset filters and paging, which the
    server under fastapi 0.154 rejects (422), and empty filter objects join away artifacts without
    a task run. Omitted fields take the server's defaults.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import Artifact

    body = {"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "sort": "KEY_ASC", "limit": 50, "offset": 0}
    with get_client(sync_client=True) as client:
        response = client.request("POST", "/artifacts/filter", json=body)
    return {a.key: a for a in Artifact.model_validate_list(response.json())}


def test_artifacts_in_a_flow_run(prefect_harness):
    from prefect import flow
    from prefect.context import get_run_context

    @flow
    def job():
        progress = report.start_progress(6)
        for done in range(1, 7):
            report.update_progress(progress, done if done < 6 else 4, 6)
        report.publish_leaderboard(ROWS, CONFIGS, "val_auc", "max", top=3)
        report.publish_summary(_summary(), extra={"MLflow run": "abc123"})
        return str(get_run_context().flow_run.id), str(progress)

    run_id, progress_id = job()
    found = _artifacts(run_id)
    assert set(found) == {report.PROGRESS_KEY, report.LEADERBOARD_KEY, report.SUMMARY_KEY}
    progress = found[report.PROGRESS_KEY]
    assert str(progress.id) == progress_id and progress.type == "progress"
    assert float(progress.data) == pytest.approx(100 * 4 / 6)
    assert progress.description == "Hyperband: 4 of 6 trial-rungs done"

    board = found[report.LEADERBOARD_KEY]
    assert board.type == "table"
    rows = json.loads(board.data)
    assert [r["trial_id"] for r in rows] == ["s1-b", "s0-d", "s1-a"]

    summary = found[report.SUMMARY_KEY]
    assert summary.type == "markdown"
    assert "0.8500 tuned" in summary.data and "| MLflow run | abc123 |" in summary.data


def test_report_tasks_are_best_effort(prefect_harness, tracking_uri, monkeypatch, tmp_path):
    from mlflow import MlflowClient
    from prefect import flow
    from prefect.context import get_run_context

    c = MlflowClient(tracking_uri)
    parent = c.create_run(c.create_experiment("report-tasks")).info.run_id

    from concurrent.futures import ThreadPoolExecutor

    @flow
    def job():
        run_id = str(get_run_context().flow_run.id)
        bar = progress_bar.ProgressBar(report.report_start(2 * len(ROWS)), 2 * len(ROWS))
        with ThreadPoolExecutor(3) as pool:  # the loop's thread and the trials' threads may move it
            list(pool.map(lambda _: bar.advance(), range(len(ROWS))))
        assert bar.flush(timeout=60)  # sent by the bar's own thread
        halfway = float(_artifacts(run_id)[report.PROGRESS_KEY].data)
        bar.finish()
        out = report.report_results(ROWS, CONFIGS, _summary(), "val_auc", "max", tracking_uri, parent,
                                    runs={"s1-b": "run-b"})
        broken = progress_bar.ProgressBar("not-a-uuid", 2).advance()  # a bad id warns, never fails the job
        untracked = progress_bar.ProgressBar(None, 2).advance()
        return run_id, out, broken, halfway, untracked

    run_id, out, broken, halfway, untracked = job()
    assert halfway == pytest.approx(50.0)
    assert broken == pytest.approx(50.0) and untracked is None
    assert out["leaderboard"] and out["summary"]
    assert out["plots"] == [report.PLOT_METRIC_VS_RESOURCE, report.PLOT_BEST_VS_WORKER_SECONDS]
    found = _artifacts(run_id)
    assert float(found[report.PROGRESS_KEY].data) == pytest.approx(100.0)
    assert {f.path for f in c.list_artifacts(parent, "plots")} == set(out["plots"])
    # the parent run's leaderboard table: the best trials, each with its child run where known
    assert out["table"] == report.LEADERBOARD_FILE
    c.download_artifacts(parent, report.LEADERBOARD_FILE, str(tmp_path))
    logged = json.loads((tmp_path / report.LEADERBOARD_FILE).read_text())
    column = {name: i for i, name in enumerate(logged["columns"])}
    assert [row[column["trial_id"]] for row in logged["data"]] == [b["trial_id"] for b in report.leaderboard(
        ROWS, CONFIGS, "val_auc", "max")]
    assert logged["data"][0][column["run_id"]] == "run-b"


def test_the_leaderboard_holds_the_top_trials_of_a_large_job_not_all_of_them():
    rows = [RungResult(f"{i:05d}", 0, 0, 1, 1, 0.1, 0.0, 1, i / 5000 if i % 7 else None) for i in range(5000)]
    board = report.leaderboard(rows, {}, "val_auc", "max")
    assert len(board) == report.LEADERBOARD_TOP
    expected = sorted((r for r in rows if r.score is not None), key=lambda r: -r.score)[:report.LEADERBOARD_TOP]
    assert [b["trial_id"] for b in board] == [r.trial_id for r in expected] and "run_id" not in board[0]


def test_a_metric_keeps_its_one_name_on_the_leaderboard_the_summary_and_the_plots():
    """A user's metric ``loss`` is ``loss`` everywhere (``Job.metric_key``, MLflow's name), never ``val_loss``."""
    from prefect_hyperband.hyperband.accounting import table

    board = report.leaderboard(ROWS, CONFIGS, "loss", "min")
    assert "loss" in board[0] and "val_loss" not in board[0]
    s = summarise(ROWS, metric="loss", configs=5, max_resource=3, reached_max_resource=2, failed_trials=1,
                  best=("s1-c", 3, 0.6), default_score=None, wall_seconds=5.0)
    assert "model quality (loss)" in table(s)
    assert report.plot_metric_vs_resource(ROWS, "loss", "min").axes[0].get_ylabel().startswith("loss ")
    assert report.plot_best_vs_worker_seconds(ROWS, "loss", "min").axes[0].get_ylabel() == "loss"


def test_the_leaderboard_ranks_ties_as_the_champion_does():
    from prefect_hyperband.hyperband.scheduler import TrialRecord, best_of

    rows = [RungResult(trial_id=t, bracket=0, rung=k, resource=r, resource_trained=1, train_seconds=1.0,
                      eval_seconds=0.1, workers=1, score=0.9)
            for t, k, r in [("s0-b", 0, 1), ("s0-b", 1, 3), ("s0-a", 1, 3)]]
    board = report.leaderboard(rows, {}, "val_auc", "max")
    records = [TrialRecord("s0-a", 0, {}, "completed", 1, 3, {3: 0.9}),
               TrialRecord("s0-b", 0, {}, "completed", 1, 3, {1: 0.9, 3: 0.9})]
    champion, resource, _ = best_of(records, "max")
    assert [(b["trial_id"], b["resource"]) for b in board] == [("s0-a", 3), ("s0-b", 1)]
    assert (champion.trial_id, resource) == (board[0]["trial_id"], board[0]["resource"])

