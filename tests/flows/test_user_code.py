"""Tuning the user's own code: the scikit-learn example through the CLI and through ``hb.tune``, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'sklearn_sgd.py'}:train"
SPACE = str(ROOT / "examples" / "sklearn_space.yaml")

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_the_sklearn_example_from_the_cli_trains_exactly_69_epochs(tracking_uri, tmp_path, capsys):
    from prefect_hyperband.app import cli

    code = cli.main(["tune", "--trainer", EXAMPLE, "--space", SPACE, "--metric", "val_loss", "--direction", "minimize",
                     "--min-resource", "1", "--max-resource", "9", "--eta", "3", "--seed", "4",
                     "--job-dir", str(tmp_path / "jobs"), "--experiment", "sk", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = result["summary"]
    assert summary["configs"] == 17 and summary["reached_max_resource"] == 5 and summary["resource_used"] == 69

    client, parent, children = runs_of(tracking_uri, "sk", result["parent_run_id"])
    assert len(children) == 17 and all(c.info.status == "FINISHED" for c in children)
    # every epoch the user's code trained reported once: resumes trained only the missing epochs
    epochs = sum(len(client.get_metric_history(c.info.run_id, "val_accuracy")) for c in children)
    assert epochs == 69
    winner = next(c for c in children if c.data.tags["hyperband.trial_id"] == result["best"]["trial_id"])
    steps = [m.step for m in client.get_metric_history(winner.info.run_id, "val_loss")]
    assert steps == list(range(1, result["best"]["resource"] + 1))  # under the user's name, not val_val_loss
    assert parent.data.metrics["best_val_loss"] == pytest.approx(result["best"]["score"])
    # the example's log_model(checkpoint_dir) logs the best in MLflow's sklearn flavour: registered as champion
    champion = client.get_model_version_by_alias("sk", "champion")
    assert champion.run_id == winner.info.run_id
    import mlflow

    model = mlflow.sklearn.load_model("models:/sk@champion")
    assert model.predict_proba(__import__("numpy").zeros((2, 64))).shape == (2, 10)
    assert set(json.loads(Path(client.download_artifacts(parent.info.run_id, "best_config.json", str(tmp_path))).read_text())["config"]) == {
        "alpha", "eta0", "learning_rate"}

    # the same job from Python on a Dask cluster of two "hosts": each trial-rung on a free worker, the file's code
    # and the checkpoint directory carried through Dask; the same numbers as in the job's own threads
    from dask_cluster import cluster  # tests/dask_cluster.py

    import prefect_hyperband as hb

    with cluster(["127.0.0.1", "127.0.0.2"], str(tmp_path)) as c:
        again = hb.tune(EXAMPLE, space=SPACE, metric="val_loss", direction="minimize", max_resource=9, eta=3, seed=4,
                        job_dir=str(tmp_path / "jobs"), experiment="sk-python", dask_address=c.address)
        here = os.getpid()

        def where(trial: hb.Trial) -> dict[str, float]:  # no importable name: Dask carries it by value
            trial.report(trial.resource, pid=os.getpid())
            return {"loss": 1.0 / (1 + trial.resource)}

        placed = hb.tune(where, space=SPACE, metric="loss", direction="minimize", max_resource=3, eta=3,
                         job_dir=str(tmp_path / "jobs"), experiment="sk-where", dask_address=c.address)
    assert again.summary["concurrency"] == 2 and again.summary["failed_trials"] == 0
    assert again.best_config == result["best"]["config"] and again.best_score == pytest.approx(result["best"]["score"])
    assert again.best_trial == result["best"]["trial_id"] and again.parent_run_id != result["parent_run_id"]
    saved = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of({"job_dir": again.job_dir})}
    assert saved == pytest.approx({(r["trial_id"], r["resource"]): r["score"] for r in rows_of(result)}, abs=1e-12)
    _, _, children = runs_of(tracking_uri, "sk-where", placed.parent_run_id)
    pids = {c.data.metrics["pid"] for c in children}
    assert placed.summary["failed_trials"] == 0 and pids and here not in pids  # it ran on the workers, not here


def rows_of(result: dict) -> list[dict]:
    return json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]


def test_a_failing_user_trainer_fails_its_trials_only(tracking_uri, tmp_path):
    import prefect_hyperband as hb

    def train(trial: hb.Trial) -> dict[str, float]:
        if trial.config["x"] > 0.5:
            raise ValueError("x too large for this model")
        for step in range(trial.start + 1, trial.resource + 1):
            trial.report(step, loss=trial.config["x"] / step)
        return {"loss": trial.config["x"] / trial.resource}

    result = hb.tune(train, space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, metric="loss", direction="minimize",
                     max_resource=3, eta=3, job_dir=str(tmp_path / "jobs"), experiment="failing", seed=1)
    assert result.best_score is not None and result.best_config["x"] <= 0.5
    _, _, children = runs_of(tracking_uri, "failing", result.parent_run_id)
    failed = [c for c in children if c.data.tags["hyperband.status"] == "failed"]
    assert failed and result.summary["failed_trials"] == len(failed)
    assert all("x too large" in c.data.tags["hyperband.error"] and c.info.status == "FAILED" for c in failed)
    # no log_model beside this trainer: nothing registered, the best checkpoint's files on the parent run
    client, parent, _ = runs_of(tracking_uri, "failing", result.parent_run_id)
    assert "hyperband.champion_version" not in parent.data.tags
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "best_checkpoint")]


def test_a_trainer_that_fails_on_every_config_fails_the_flow_run_and_the_parent_run(tracking_uri, tmp_path):
    """Nothing tuned: the job's end is written (summary, every trial's run FAILED), then the parent run ends FAILED,
    the flow run Failed (as the Prefect UI shows it) and ``hb.tune`` raises with the first trial's error."""
    from prefect import get_client

    import prefect_hyperband as hb

    def train(trial: hb.Trial) -> dict[str, float]:
        raise ValueError("bad config handling")

    with pytest.raises(hb.EveryTrialFailed, match=r"every trial failed \(5\), the first with s1-0000: ValueError: "
                                                  r"bad config handling \(each traceback: .*job\.log\)") as failed:
        hb.tune(train, space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, metric="loss", direction="minimize",
                max_resource=3, eta=3, job_dir=str(tmp_path / "jobs"), experiment="all-failing", seed=1)
    result = failed.value.result
    assert result.best_score is None and result.summary["failed_trials"] == 5
    client, parent, children = runs_of(tracking_uri, "all-failing", result.parent_run_id)
    assert parent.info.status == "FAILED" and [a.path for a in client.list_artifacts(parent.info.run_id)
                                               if a.path == "summary.json"]
    assert len(children) == 5 and {c.info.status for c in children} == {"FAILED"}
    with get_client(sync_client=True) as prefect:
        jobs = [r for r in prefect.read_flow_runs() if r.parent_task_run_id is None and r.name.endswith(
            f"({result.job_id})")]  # this job's, of the module's flow runs (one Prefect harness): its id in its name
    assert [(r.state.type.value, r.state.message) for r in jobs] == [
        ("FAILED", "every trial failed (5), the first with s1-0000: ValueError: bad config handling")]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--trainer", "nosuch.py:train", "--metric", "loss", "--direction", "minimize", "--space", SPACE],
         "trainer file 'nosuch.py' not found"),
        (["--trainer", EXAMPLE.replace(":train", ":fit"), "--metric", "loss", "--direction", "minimize", "--space", SPACE],
         "has no function 'fit'"),
        (["--trainer", EXAMPLE, "--direction", "minimize", "--space", SPACE], "your own trainer needs metric"),
        (["--trainer", EXAMPLE, "--metric", "val_loss", "--space", SPACE], "your own trainer needs direction"),
        (["--trainer", EXAMPLE, "--metric", "val_loss", "--direction", "minimize"], "your own trainer needs space"),
        (["--trainer", EXAMPLE, "--metric", "val_loss", "--direction", "down", "--space", SPACE], "--direction: Input should be 'minimize' or 'maximize', got 'down'"),
        (["--trainer", EXAMPLE, "--metric", "val_loss", "--direction", "minimize", "--space", SPACE, "--workers", "2",
          "--dask-address", "tcp://127.0.0.1:8786"], "runs each trial-rung on one Dask worker; drop workers (2)"),
    ],
)
def test_bad_user_code_input_is_one_line_and_exit_2(tracking_uri, tmp_path, capsys, extra, message):
    from prefect_hyperband.app import cli

    try:
        code = cli.main(["tune", "--job-dir", str(tmp_path / "jobs"), *extra])
    except SystemExit as exc:  # argparse's own errors (a bad choice) exit from the parser
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("hyperband: error: "), err
    assert message in err
