"""ASHA, TPE, side-by-side brackets and resume, on the instant synthetic objective."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

from prefect_hyperband.executors.state import saved_rows
from prefect_hyperband.flows.params import TuneParams

pytestmark = pytest.mark.usefixtures("prefect_harness")


def children(uri: str, experiment: str, parent_run_id: str):
    return runs_of(uri, experiment, parent_run_id)[2]


def test_asha_runs_to_max_trials_and_records_every_trial(tracking_uri, tmp_path, monkeypatch):
    from prefect_hyperband.flows.tune import tune
    from prefect_hyperband.tasks import importance_report

    monkeypatch.setattr(importance_report, "LIVE_INTERVAL", 0.0)  # importances while results arrive: at each chance

    result = tune(TuneParams(model="synthetic", mode="asha", max_resource=27, eta=3, max_trials=30, concurrency=2,
                             job_dir=str(tmp_path), experiment="asha", baseline=False))
    summary = result["summary"]
    assert summary["configs"] == 30 and summary["failed_trials"] == 0
    runs = children(tracking_uri, "asha", result["parent_run_id"])
    assert len(runs) == 30
    statuses = {r.data.tags["hyperband.status"] for r in runs}
    assert statuses <= {"completed", "stopped"} and all(r.info.status == "FINISHED" for r in runs)
    # every promotion resumed: units trained equal the sum over trials of the resource each reached
    state = json.loads((Path(result["job_dir"]) / "state.json").read_text())
    assert state["scheduler"]["kind"] == "asha" and len(state["rows"]) == summary["trial_rungs"]
    reached = sum(t["resource"] for t in state["scheduler"]["state"]["trials"].values())
    assert summary["resource_used"] == reached
    assert result["best"]["score"] < 0.2
    # which hyperparameters mattered: on the parent run (metrics, table, chart) and in the summary
    client, parent, _ = runs_of(tracking_uri, "asha", result["parent_run_id"])
    shares = {k: v for k, v in parent.data.metrics.items() if k.startswith("importance.")}
    assert set(shares) == {"importance.x", "importance.y"} and sum(shares.values()) == pytest.approx(1.0)
    assert {"importance.json", "plots"} <= {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert "which hyperparameters mattered (PED-ANOVA, " in result["table"]
    assert parent.data.tags["hyperband.importance"].startswith("ped-anova, ")
    # while results arrived, too: a curve over the job's results, its last point the job's final one
    steps = [m.step for m in client.get_metric_history(parent.info.run_id, "importance.x")]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == summary["trial_rungs"] > steps[0]


def test_tpe_sync_runs_brackets_in_turn(tracking_uri, tmp_path):
    from prefect_hyperband.flows.tune import tune

    result = tune(TuneParams(model="synthetic", sampler="tpe", max_resource=9, eta=3, seed=3,
                             job_dir=str(tmp_path), experiment="tpe", baseline=False))
    assert result["summary"]["configs"] == 17 and result["summary"]["resource_used"] == 69
    assert len(children(tracking_uri, "tpe", result["parent_run_id"])) == 17


def test_prior_first_trains_the_priors_mode_to_r_before_the_brackets(tracking_uri, tmp_path):
    """--prior-first: one more trial, the priors' mode at R, in MLflow and the summary; the sampler never told."""
    from prefect_hyperband.flows.tune import tune

    space = {"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.55, "confidence": "high"},
             "y": {"type": "float", "low": 0.0, "high": 1.0}}  # no prior: its centre, 0.5
    result = tune(TuneParams(model="synthetic", sampler="priorband", prior_first=True, space=space, max_resource=9,
                             eta=3, seed=3, job_dir=str(tmp_path), experiment="prior-first", baseline=False))
    assert result["summary"]["configs"] == 17 + 1 and result["summary"]["resource_used"] == 69 + 9
    runs = {r.data.tags["hyperband.trial_id"]: r for r in children(tracking_uri, "prior-first", result["parent_run_id"])}
    assert len(runs) == 18
    prior = runs["prior"]
    assert prior.data.tags["hyperband.bracket"] == "-1" and prior.data.tags["hyperband.status"] == "completed"
    assert (float(prior.data.params["x"]), float(prior.data.params["y"])) == (0.55, 0.5)
    assert "val_loss" in prior.data.metrics
    state = json.loads((Path(result["job_dir"]) / "state.json").read_text())["scheduler"]
    assert state["prior_first"]["status"] == "completed" and state["prior_first"]["config"] == {"x": 0.55, "y": 0.5}
    told = [o["config"] for obs in state["sampler"]["observations"].values() for o in obs]
    assert {"x": 0.55, "y": 0.5} not in told and len(told) == 22  # the brackets' 22 trial-rungs, not the prior's


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("search", [  # synchronous brackets: three jobs SIGKILLed at once in test_postgres.py
    {"mode": "asha", "concurrency": 1},  # ASHA at 1: its promotions do not depend on timing
    {"sampler": "tpe", "concurrency": 2},
], ids=["asha", "tpe"])
def test_killed_job_resumes_without_retraining_or_duplicate_runs(search, tmp_path, mlflow_db, monkeypatch):
    """Kill a job mid-way (SIGKILL); --resume finishes it with the result of an uninterrupted job of the same seed."""
    from prefect.settings import PREFECT_API_URL

    from prefect_hyperband.flows.tune import tune

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONUNBUFFERED": "1",
           "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's server: no temporary server per job
    flags = [f"--{k}={v}" for k, v in search.items()]
    common = ["--model", "synthetic", "--max-resource", "9", "--unit-seconds", "0.05", *flags,
              "--seed", "11", "--job-dir", str(tmp_path / "jobs"), "--no-baseline", "--json"]

    # the uninterrupted job of the same flags, in this process (a process of its own adds seconds, not coverage),
    # in the jobs' folder: the experiment it creates keeps its artifacts there
    monkeypatch.chdir(tmp_path)
    uninterrupted = tune(TuneParams(model="synthetic", max_resource=9, unit_seconds=0.05, seed=11, baseline=False,
                                    job_dir=str(tmp_path / "jobs"), job_id="whole", tracking_uri=mlflow_db, **search))

    killed = run_cli([*common, "--job-id", "cut"], tmp_path, env)
    state = tmp_path / "jobs" / "cut" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until some, not all, trial-rungs are recorded
        recorded = len(saved_rows(state.parent)) if state.exists() else 0
        if recorded >= 8:
            break
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert 8 <= recorded < 22

    resumed = run_cli(["--resume", "cut", "--job-dir", str(tmp_path / "jobs"), "--json"], tmp_path, env)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])

    assert result["parent_run_id"] is not None
    assert result["summary"]["trial_rungs"] == uninterrupted["summary"]["trial_rungs"]  # none trained twice
    assert result["summary"]["resource_used"] == uninterrupted["summary"]["resource_used"]
    assert result["best"]["trial_id"] == uninterrupted["best"]["trial_id"]
    assert result["best"]["score"] == pytest.approx(uninterrupted["best"]["score"])
    configs = uninterrupted["summary"]["configs"]
    runs = children(env["MLFLOW_TRACKING_URI"], "hyperband", result["parent_run_id"])
    assert len(runs) == configs and len({r.data.tags["hyperband.trial_id"] for r in runs}) == configs
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_trial_rung_whose_orchestration_fails_is_run_again_not_failed(tracking_uri, tmp_path, monkeypatch):
    """An API error around a trial-rung (e.g. a 503 under load) is not the trial's fault: the driver runs it again."""
    from prefect_hyperband.flows import driver
    from prefect_hyperband.flows.tune import tune

    real, calls = driver.runner.work, {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] in (4, 5):
            raise RuntimeError("simulated: Prefect API answered 503")
        return real(*args, **kwargs)

    monkeypatch.setattr(driver.runner, "work", flaky)
    result = tune(TuneParams(model="synthetic", max_resource=9, eta=3, concurrency=1, seed=2,
                             job_dir=str(tmp_path), experiment="retry", baseline=False))
    summary = result["summary"]
    assert calls["n"] == 24  # 22 trial-rungs, one of them tried three times
    assert summary["trial_rungs"] == 22 and summary["resource_used"] == 69 and summary["configs"] == 17
    assert summary["failed_trials"] == 0
    runs = children(tracking_uri, "retry", result["parent_run_id"])
    assert len(runs) == 17 and all(r.info.status == "FINISHED" for r in runs)


def test_orchestration_failing_past_its_retries_fails_the_trial_only(tracking_uri, tmp_path, monkeypatch):
    from prefect_hyperband.flows import driver
    from prefect_hyperband.flows.tune import tune

    real = driver.runner.work

    def broken_for_one(job, trial_rung, **kwargs):
        if trial_rung.trial_id == "s1-0000":
            raise RuntimeError("simulated: API down for this trial")
        return real(job, trial_rung, **kwargs)

    monkeypatch.setattr(driver.runner, "work", broken_for_one)
    result = tune(TuneParams(model="synthetic", max_resource=3, eta=3, concurrency=2, seed=2,
                             job_dir=str(tmp_path), experiment="broken", baseline=False))
    assert result["summary"]["failed_trials"] == 1 and result["summary"]["configs"] == 5
    runs = {r.data.tags["hyperband.trial_id"]: r for r in children(tracking_uri, "broken", result["parent_run_id"])}
    assert len(runs) == 5  # the failed trial has its child run too, with the reason
    assert runs["s1-0000"].info.status == "FAILED"
    assert "API down" in runs["s1-0000"].data.tags["hyperband.error"]


@pytest.mark.parametrize("mode", ["hyperband", "asha"])
def test_progress_observers_see_the_plan_and_every_result(mode, tracking_uri, tmp_path):
    """What the live display draws: trial-rungs per bracket as planned, one event per result, the job's best."""
    import io

    from prefect_hyperband.app.terminal import LiveDisplay
    from prefect_hyperband.executors import progress
    from prefect_hyperband.flows.tune import tune

    class Recorder:
        def __init__(self):
            self.starts, self.results, self.stops = [], [], 0

        def start(self, event):
            self.starts.append(event)

        def result(self, event):
            self.results.append(event)

        def stop(self):
            self.stops += 1

    recorder, live = Recorder(), LiveDisplay(io.StringIO())
    progress.attach(recorder)
    progress.attach(live)
    try:
        result = tune(TuneParams(model="synthetic", max_resource=9, eta=3, concurrency=2, seed=4, mode=mode,
                                 job_dir=str(tmp_path), experiment=f"progress-{mode}", baseline=False))
    finally:
        progress.detach(recorder)
        progress.detach(live)
    (start,) = recorder.starts
    assert start.planned == {2: 13, 1: 6, 0: 3} and start.done == {}
    assert len(recorder.results) == result["summary"]["trial_rungs"] and recorder.stops == 1
    last = recorder.results[-1]
    assert last.best == pytest.approx(result["summary"]["best_score"])
    assert live.progress is None  # stopped with the job
    shown = live.console.file.getvalue()
    assert f"best val_loss {result['summary']['best_score']:.4f}" in shown


def test_each_bracket_is_a_subflow_run_of_train_evaluate_and_promote_task_runs(tracking_uri, tmp_path):
    """The job's DAG in the Prefect UI: under the job's flow run, one ``hyperband-group`` subflow run per bracket,
    holding train and evaluate per trial-rung and promote per closed rung (``flows.groups``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    from prefect_hyperband.flows.tune import tune

    state = tune(TuneParams(model="synthetic", max_resource=9, eta=3, concurrency=2, job_dir=str(tmp_path),
                            experiment="dag", baseline=False), return_state=True)
    summary = state.result()["summary"]
    assert summary["trial_rungs"] == 22
    job_run = state.state_details.flow_run_id
    names: dict[str, list[str]] = {}
    with get_client(sync_client=True) as client:
        groups = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[job_run])))
        assert sorted(g.name for g in groups) == ["bracket s=0", "bracket s=1", "bracket s=2"]
        assert all(g.state.is_completed() for g in groups)
        # The server records task runs from their events, usually within a second or so. Its recorder's
        # write can wait out a busy SQLite (PREFECT_SERVER_DATABASE_TIMEOUT, 60 s here) and be retried:
        # CI once missed the last promote after 30 s. So wait up to 150 s; a pass ends the wait at once.
        deadline = time.monotonic() + 150
        while True:
            names = {g.name: [t.name for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[g.id])), limit=200)] for g in groups}
            if sum(map(len, names.values())) >= 2 * 22 + 6 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        in_job = [t.name for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[job_run])), limit=200)]
    assert not [n for n in in_job if n.split(" ")[0] in ("train", "evaluate", "promote")]
    # (1, 9, 3): bracket s=2 trains 9 + 3 + 1 and closes 3 rungs, s=1 trains 5 + 1 and closes two, s=0 trains 3
    for s, trained, rungs in ((2, 13, 3), (1, 6, 2), (0, 3, 1)):
        kinds = [n.split(" ")[0] for n in names[f"bracket s={s}"]]
        assert kinds.count("train") == trained and kinds.count("evaluate") == trained
        assert sorted(n for n in names[f"bracket s={s}"] if n.startswith("promote")) == [
            f"promote bracket s={s} rung {r}" for r in range(rungs)]


def test_trial_rung_metrics_are_written_by_the_mlflow_writer_before_the_result_enters_the_state(tracking_uri, tmp_path,
                                                                                                 monkeypatch):
    """The trials' MLflow writes run in a process of their own, and a saved result always has its metric in the
    tracking store already (read back from the store at every save)."""
    from mlflow import MlflowClient

    from prefect_hyperband.executors.state import StateWriter
    from prefect_hyperband.flows.tune import tune
    from prefect_hyperband.tracking import writer

    client = MlflowClient(tracking_uri)
    checked: set[tuple[str, int]] = set()
    pids: list[int] = []
    real_save, real_init = StateWriter.save, writer.ProcessWriter.__init__

    def checked_save(self, rows, *args, **kwargs):
        for r in rows[self.rows_saved:]:
            steps = {m.step for m in client.get_metric_history(self.runs[r["trial_id"]], "val_loss")}
            assert r["resource"] in steps, f"{r['trial_id']} at r={r['resource']} saved before its MLflow write"
            checked.add((r["trial_id"], r["resource"]))
        return real_save(self, rows, *args, **kwargs)

    def spy(self):
        real_init(self)
        pids.append(self.proc.pid)

    monkeypatch.setattr(StateWriter, "save", checked_save)
    monkeypatch.setattr(writer.ProcessWriter, "__init__", spy)
    monkeypatch.setenv("HYPERBAND_MLFLOW_WRITER", "process")  # a small job's default is the thread (writer_for)
    result = tune(TuneParams(model="synthetic", max_resource=9, eta=3, concurrency=2, job_dir=str(tmp_path),
                             experiment="writer", baseline=False))
    assert result["summary"]["trial_rungs"] == 22 and len(checked) == 22
    assert len(pids) == 1 and pids[0] != os.getpid()
    state = json.loads((Path(result["job_dir"]) / "state.json").read_text())
    assert {(r["trial_id"], r["resource"]) for r in state["rows"]} == checked


def test_a_job_ends_when_its_goal_is_met_and_a_resume_with_a_looser_goal_finishes_it(tracking_uri, tmp_path):
    """--target-score: no new trial-rung once a result at R reaches it; those in flight finish, the summary and the
    parent run say why, the runs of trials waiting in a rung end; --resume with a looser criterion goes on with
    them, each trial-rung once. (Patience's counting is tested on fakes: tests/hyperband/test_criteria.py.)"""
    from prefect_hyperband.flows.tune import tune

    base = dict(model="synthetic", max_resource=9, eta=3, concurrency=1, job_dir=str(tmp_path), experiment="goal",
                baseline=False, job_id="goal")
    first = tune(TuneParams(**base, target_score=1.0))  # val_loss <= 1.0: the first result at R=9 meets it
    assert first["stopped_by"].startswith("target score 1 reached: val_loss ")
    assert first["stopped_by"].endswith("at r=9")
    assert "stopped before the schedule's end: target score 1 reached" in first["table"]
    done = first["summary"]["trial_rungs"]
    assert done < 22  # (1, 9, 3) is 22 trial-rungs; bracket s=2 reaches R at its 13th, and stops there
    client, parent, runs = runs_of(tracking_uri, "goal", first["parent_run_id"])
    assert parent.data.tags["hyperband.stopped_by"] == first["stopped_by"]
    assert all(r.info.status == "FINISHED" for r in runs)  # decided, or paused in a rung
    again = tune(TuneParams(**{**base, "resume": True}, target_score=0.0))  # nothing reaches 0: never met
    assert again["stopped_by"] is None and again["summary"]["trial_rungs"] == 22
    rows = saved_rows(str(tmp_path / "goal"))
    assert len({(r["trial_id"], r["resource"]) for r in rows}) == len(rows) == 22
    _, _, runs = runs_of(tracking_uri, "goal", first["parent_run_id"])
    assert {r.data.tags["hyperband.status"] for r in runs} <= {"completed", "stopped"}
    assert len(runs) == 17  # one child run per config, across the stop


def test_the_baseline_trains_once_in_a_slot_across_a_stop_and_a_resume_and_is_no_trial_of_the_search(tracking_uri, tmp_path):
    """The default config trained to R is the scheduler's first trial-rung (``hyperband.first.Firsts``): its metric is the
    summary's and the parent run's, its seconds are the job's cost, it meets no goal, has no child run, and the
    job's state keeps it: the resume does not train it again."""
    from prefect_hyperband.flows.tune import tune

    base = dict(model="synthetic", max_resource=9, eta=3, concurrency=1, job_dir=str(tmp_path), experiment="base",
                job_id="base")
    first = tune(TuneParams(**base, target_score=1.0))  # every result at R meets it: the search's first there ends it
    assert "by trial default" not in first["stopped_by"]
    checkpoint = tmp_path / "base" / "checkpoints" / "default" / "r9.json"
    made = checkpoint.stat().st_mtime_ns
    summary = first["summary"]
    assert summary["default_score"] is not None and summary["baseline_worker_seconds"] > 0
    again = tune(TuneParams(**{**base, "resume": True}, target_score=0.0))
    assert checkpoint.stat().st_mtime_ns == made  # not trained again
    assert again["summary"]["default_score"] == summary["default_score"]
    assert again["summary"]["baseline_worker_seconds"] == summary["baseline_worker_seconds"]
    assert again["summary"]["trial_rungs"] == 22 and again["summary"]["configs"] == 17  # the search's own
    rows = saved_rows(str(tmp_path / "base"))
    assert [r["trial_id"] for r in rows].count("default") == 1 and len(rows) == 23
    client, parent, runs = runs_of(tracking_uri, "base", first["parent_run_id"])
    assert len(runs) == 17 and "default" not in {r.data.tags["hyperband.trial_id"] for r in runs}
    assert client.get_run(first["parent_run_id"]).data.metrics["default_val_loss"] == pytest.approx(summary["default_score"])


def test_a_target_resource_above_r_is_one_line_and_exit_2(capsys):
    from prefect_hyperband.app.cli import main

    assert main(["tune", "--model", "synthetic", "--max-resource", "9", "--target-score", "0.1",
                 "--target-resource", "27"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hyperband: error: --target-resource must be <= --max-resource, got 27 > 9"
