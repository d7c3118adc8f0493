"""Job identity and bounds: an id is never silently reused, a resume never mixes two jobs, one process per job,
no flag takes the machine down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from prefect_hyperband.executors.state import saved_rows

pytestmark = pytest.mark.usefixtures("prefect_harness")
SMALL = ["--model", "synthetic", "--max-resource", "3", "--eta", "3", "--no-baseline"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    from prefect_hyperband.app import cli

    try:
        code = cli.main(["tune", *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err.strip()


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("hyperband: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_used_job_id_is_refused_naming_resume(tracking_uri, tmp_path, capsys):
    jobs = str(tmp_path / "jobs")
    assert run(capsys, *SMALL, "--job-dir", jobs, "--job-id", "once")[0] == 0
    code, _, err = run(capsys, *SMALL, "--job-dir", jobs, "--job-id", "once")
    assert code == 2
    assert "job 'once' already exists" in one_line(err) and "--resume once" in err


def test_a_conflicting_resume_is_refused_naming_both_values_and_a_plain_one_takes_the_saved_job(tracking_uri, tmp_path, capsys):
    jobs = str(tmp_path / "jobs")
    assert run(capsys, *SMALL, "--job-dir", jobs, "--job-id", "r3")[0] == 0
    code, _, err = run(capsys, "--resume", "r3", "--job-dir", jobs, "--max-resource", "27")
    assert code == 2
    assert "started with max_resource=3; resuming it with max_resource=27" in one_line(err)
    # what a resume may change is accepted; the saved job runs (nothing left to train: it finished)
    code, out, _ = run(capsys, "--resume", "r3", "--job-dir", jobs, "--concurrency", "1", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["summary"]["trial_rungs"] == 6

    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    state = tune(TuneParams(job_dir=jobs, job_id="r3", resume=True, eta=4), return_state=True)
    assert state.is_failed() and "started with eta=3; resuming it with eta=4" in state.message
    result = tune(TuneParams(job_dir=jobs, job_id="r3", resume=True))  # Python: the saved parameters
    assert result["summary"]["max_resource"] == 3 and result["summary"]["trial_rungs"] == 6


def test_a_resume_from_another_folder_finds_the_store_the_job_began_in_and_a_store_without_it_is_one_line(
        tmp_path, mlflow_template, monkeypatch, capsys):
    """Found by a fuzz: the default ``sqlite:///mlflow.db`` is relative to the folder a job starts from; resumed from
    another (``--job-dir`` absolute) the job looked for its parent run in another store and ended in a traceback."""
    import shutil

    began, elsewhere = tmp_path / "began", tmp_path / "elsewhere"
    began.mkdir(), elsewhere.mkdir()
    shutil.copyfile(mlflow_template, began / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(began)
    jobs = str(began / "jobs")
    code, out, err = run(capsys, *SMALL, "--job-dir", jobs, "--job-id", "here", "--json")
    assert code == 0, err
    parent = json.loads(out.strip().splitlines()[-1])["parent_run_id"]
    monkeypatch.chdir(elsewhere)
    code, out, err = run(capsys, "--resume", "here", "--job-dir", jobs, "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out.strip().splitlines()[-1])["parent_run_id"] == parent
    assert not (elsewhere / "mlflow.db").exists()  # the store it began in, not a new one here
    other = f"sqlite:///{elsewhere / 'other.db'}"
    shutil.copyfile(mlflow_template, elsewhere / "other.db")
    code, _, err = run(capsys, "--resume", "here", "--job-dir", jobs, "--tracking-uri", other)
    assert code == 2 and "Traceback" not in err, err
    assert (f"job 'here': its parent run {parent} is not in the MLflow store {other}; it was started with "
            f"sqlite:///{began / 'mlflow.db'}: resume with --tracking-uri sqlite:///{began / 'mlflow.db'}") in one_line(err)


def test_a_resume_whose_two_state_files_are_gone_but_its_journal_is_there_is_one_line(tracking_uri, tmp_path, capsys):
    """Found by a fuzz: with ``state.json`` and ``state.json.prev`` deleted, a resume started over silently and
    trained every trial again beside its logged child runs. A job whose loop never began (no journal, no
    checkpoint) starts over."""
    import shutil

    jobs = tmp_path / "jobs"
    assert run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "gone")[0] == 0
    assert list(jobs.glob("gone/journal.*"))
    (jobs / "gone" / "state.json").rename(jobs / "gone" / "state.json.damaged")  # a name that only begins like it
    (jobs / "gone" / "state.json.prev").unlink()
    for _ in range(2):  # the journal there, then only the checkpoints
        code, _, err = run(capsys, "--resume", "gone", "--job-dir", str(jobs))
        assert code == 2 and "Traceback" not in err, err
        assert f"job 'gone': {jobs / 'gone' / 'state.json'} and its previous version are gone" in one_line(err)
        for journal in jobs.glob("gone/journal.*"):
            journal.unlink()
    shutil.rmtree(jobs / "gone" / "checkpoints")
    code, out, err = run(capsys, "--resume", "gone", "--job-dir", str(jobs), "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["summary"]["trial_rungs"] == 6


def test_one_process_per_job_and_a_stale_lock_is_taken_over(tracking_uri, tmp_path, capsys):
    jobs = tmp_path / "jobs"
    (jobs / "held").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (jobs / "held" / "lock").write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid}))
        code, _, err = run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "held")
        assert code == 2 and f"pid {holder.pid}" in one_line(err) and "already running" in err
    finally:
        holder.kill()
        holder.wait()
    # the holder's machine is gone: another host's lock not refreshed for longer than STALE_AFTER is taken over
    # (a dead process's lock on this host: tests/flows/test_lock.py), said in one line; no lock left behind
    from prefect_hyperband.flows.lock import STALE_AFTER

    (jobs / "held" / "lock").write_text(json.dumps({"host": "controller-2", "pid": 4242}))
    os.utime(jobs / "held" / "lock", (time.time() - STALE_AFTER - 60,) * 2)
    code, _, err = run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "held")
    assert code == 0, err
    assert "took over the job's lock from host controller-2 (pid 4242)" in (jobs / "held" / "job.log").read_text()
    assert not (jobs / "held" / "lock").exists()


def test_local_workers_above_the_cores_are_refused(tracking_uri, tmp_path, capsys):
    cores = os.cpu_count() or 1
    code, _, err = run(capsys, "--workers", str(cores + 1), "--max-resource", "3", "--job-dir", str(tmp_path))
    assert code == 2
    assert f"machine of {cores} cores" in one_line(err) and "--dask-address" in err


def test_a_plan_above_the_bound_is_refused_before_any_work(tracking_uri, tmp_path, capsys):
    code, _, err = run(capsys, *SMALL[:2], "--max-resource", "1000000", "--eta", "2", "--job-dir", str(tmp_path))
    assert code == 2
    line = one_line(err)
    assert "trial-rungs" in line and "the largest a job accepts is 100,000 trial-rungs" in line
    assert [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]  # nothing created but the fixture's empty store


@pytest.mark.slow
def test_two_resumes_at_once_one_runs_the_other_is_refused_naming_the_holder(tmp_path, mlflow_db):
    """A killed job resumed twice at the same time (two terminals): one finishes it, the other is refused."""
    import signal
    import time

    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONUNBUFFERED": "1",
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    jobs = tmp_path / "jobs"

    def cli(*argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "prefect_hyperband.app.cli", "tune", *argv, "--job-dir", str(jobs),
                                 "--json"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    first = cli("--model", "synthetic", "--max-resource", "9", "--unit-seconds", "0.1", "--concurrency", "1",
                "--no-baseline", "--job-id", "twice")
    state = jobs / "twice" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and not (state.exists() and len(saved_rows(state.parent)) >= 4):
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)

    a, b = cli("--resume", "twice"), cli("--resume", "twice")
    (out_a, err_a), (out_b, err_b) = a.communicate(timeout=600), b.communicate(timeout=600)
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], (err_a[-2000:], err_b[-2000:])
    refused = err_a if a.returncode == 2 else err_b
    assert "already running" in one_line(refused) and socket.gethostname() in refused
    result = json.loads((out_a if a.returncode == 0 else out_b).strip().splitlines()[-1])
    assert result["summary"]["trial_rungs"] == 22 and result["summary"]["resource_used"] == 69  # trained once
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == result["parent_run_id"]]
    assert len(children) == 17 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 17


def test_mlflow_not_answering_at_the_start_stops_the_job_in_one_line(tracking_uri, tmp_path, capsys, monkeypatch):
    """The parent run cannot be made (MLflow's client gave up after --service-wait): exit 75, one line, no
    traceback, nothing trained; the same command later runs the job."""
    from mlflow.exceptions import MlflowException

    from prefect_hyperband.tracking import records
    from prefect_hyperband.tracking import runs as tracking

    calls = []

    def down(*args, **kwargs):
        calls.append(1)
        raise MlflowException("API request to http://mlflow:5000/api/2.0/mlflow/runs/create failed with exception "
                              "HTTPConnectionPool(host='mlflow', port=5000): Max retries exceeded with url: "
                              "/api/2.0/mlflow/runs/create (Caused by ResponseError('too many 503 error responses'))")

    start_parent = tracking.start_parent
    monkeypatch.setattr(tracking, "start_parent", down)
    monkeypatch.setattr(records.retrying, "__kwdefaults__", {"delays": (0.0, 0.0, 0.0), "within": None})  # no waits
    jobs = tmp_path / "jobs"
    code, _, err = run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "mlflow-down", "--service-wait", "30")
    assert code == 75, err
    said = [line for line in err.splitlines() if line.startswith("hyperband: job mlflow-down stopped: ")]
    assert len(said) == 1 and "did not answer within 30 s (--service-wait)" in said[0] and "Max retries exceeded" in said[0]
    # no traceback of the error (stderr may also hold a "--- Logging error ---" of Prefect's
    # console handler, left writing to an earlier test's captured stream: not the job's), and job.log has none
    assert "raise MlflowException" not in err and "Encountered exception" not in err
    assert "Traceback" not in (jobs / "mlflow-down" / "job.log").read_text()
    assert len(calls) == 4 and not saved_rows(jobs / "mlflow-down")  # tried 4 times (1, 5, 15 s apart; 0 here), nothing ran
    # MLflow answers again (only this patch undone: monkeypatch.undo() also undid the test's own MLflow store, and
    # the job wrote to mlflow.db in the checkout)
    monkeypatch.setattr(tracking, "start_parent", start_parent)
    code, _, err = run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "mlflow-down")
    assert code == 0, err
    client = tracking.client(tracking_uri)
    assert [r.info.run_name for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
            if r.info.run_name == "hyperband-mlflow-down"] == ["hyperband-mlflow-down"]  # in the test's own store


GONE = ("API request to http://mlflow:5000/api/2.0/mlflow-artifacts/artifacts failed with exception "
        "HTTPConnectionPool(host='mlflow', port=5000): Max retries exceeded")
FULL = "(sqlite3.OperationalError) database or disk is full"


@pytest.mark.parametrize(("error", "said_why", "tries"), [
    (GONE, "MLflow did not answer within 30 s (--service-wait) while", 1),  # its client had waited --service-wait
    (FULL, "no space left on device while", 4),  # tried again 1, 5, 15 s later (0 here)
], ids=["gone", "full"])
def test_mlflow_gone_or_full_after_the_last_result_stops_the_job_in_one_line_and_resume_writes_its_end(
        error, said_why, tries, tracking_uri, tmp_path, capsys, monkeypatch):
    """Every result is in (and saved); then MLflow stops answering, or its disk is full, while the job writes its
    summary: exit 75, one line, no traceback; --resume trains nothing again and writes the end: the parent run
    FINISHED with its summary, each trial's run once."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from prefect_hyperband.tracking import records, service_wait
    from prefect_hyperband.tracking import runs as tracking

    calls = []

    def down(*args, **kwargs):
        calls.append(1)
        raise MlflowException(error)

    jobs = tmp_path / "jobs"
    with monkeypatch.context() as gone:
        gone.setattr(tracking, "log_text", down)  # the summary's write, at the job's end only
        gone.setattr(records.retrying, "__kwdefaults__", {"delays": (0.0, 0.0, 0.0), "within": None})  # no waits
        if error is GONE:
            gone.setattr(service_wait, "client_waits", lambda: 1e-9)  # as if its client had waited out its bound
        code, _, err = run(capsys, *SMALL, "--job-dir", str(jobs), "--job-id", "end-down", "--service-wait", "30")
    assert code == 75, err
    said = [line for line in err.splitlines() if line.startswith("hyperband: job end-down stopped: ")]
    assert len(said) == 1, err
    assert f"{said_why} the job's end was written to MLflow at {tracking_uri}: {error}" in said[0]
    assert said[0].endswith("--resume end-down writes its summary and model")
    assert "raise MlflowException" not in err and "Encountered exception" not in err
    assert "Traceback" not in (jobs / "end-down" / "job.log").read_text()
    assert len(calls) == tries and len(saved_rows(jobs / "end-down")) == 6  # every trial-rung saved
    code, out, err = run(capsys, "--resume", "end-down", "--job-dir", str(jobs))
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 "tags.`hyperband.job_id` = 'end-down'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    assert "summary.txt" in {a.path for a in client.list_artifacts(parent)}
    children = client.search_runs([parents[0].info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert len(children) == 5 and len({r.data.tags["hyperband.trial_id"] for r in children}) == 5
    assert all(r.info.status == "FINISHED" for r in children) and len(saved_rows(jobs / "end-down")) == 6


def test_a_resume_whose_table_changed_is_refused_in_one_line_unless_allowed(tracking_uri, tmp_path, capsys):
    """A table in parts: the parent run names where it lives (URL, parts, the listing's digest) and its dataset
    inputs come from there; a part added before a resume is one line, exit 2, and ``--allow-data-change`` goes on,
    unless the new data has columns or categories the job's checkpoints were not trained on."""
    import mlflow
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    table = tmp_path / "table"
    table.mkdir()
    for i in range(3):
        x = rng.normal(size=(60, 3))
        frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(label=(x[:, 0] > 0).astype(int),
                                                                color=rng.choice(["red", "blue"], size=60))
        frame.to_parquet(table / f"part-{i}.parquet", index=False)
    jobs = str(tmp_path / "jobs")
    flags = ["--data", str(table), "--target", "label", "--max-resource", "3", "--no-baseline", "--job-dir", jobs]
    code, out, err = run(capsys, *flags, "--job-id", "t1", "--json")
    assert code == 0, err
    parent = mlflow.MlflowClient(tracking_uri).get_run(json.loads(out.strip().splitlines()[-1])["parent_run_id"])
    assert parent.data.tags["hyperband.data.url"] == str(table) and parent.data.tags["hyperband.data.parts"] == "3"
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == ["table (training)", "table (validation)"]
    assert str(table) in parent.inputs.dataset_inputs[0].dataset.source
    frame.to_parquet(table / "part-3.parquet", index=False)
    code, _, err = run(capsys, "--resume", "t1", "--job-dir", jobs)
    assert code == 2
    line = one_line(err)
    assert f"job 't1': its data changed since it began ({table}: 3 part(s)" in line and "4 of" in line
    assert "--allow-data-change" in line
    code, _, err = run(capsys, "--resume", "t1", "--job-dir", jobs, "--allow-data-change")
    assert code == 0, err
    frame.assign(color="green").to_parquet(table / "part-4.parquet", index=False)  # a category its checkpoints lack
    code, _, err = run(capsys, "--resume", "t1", "--job-dir", jobs, "--allow-data-change")
    assert code == 2 and "its data's columns or categories changed since it began (new: color_green" in one_line(err)
