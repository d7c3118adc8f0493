"""The CLI: the plan as the paper's table and as JSON; bad input ends in one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prefect_hyperband.app.cli import main


def test_plan_json_has_the_documented_shape(capsys):
    assert main(["plan", "--min-resource", "1", "--max-resource", "81", "--eta", "3", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["min_resource"], plan["max_resource"], plan["eta"], plan["configs"]) == (1, 81, 3, 143)
    assert plan["brackets"][0]["s"] == 4
    assert plan["brackets"][0]["rungs"][0] == {"n_configs": 81, "resource": 1}
    assert [b["s"] for b in plan["brackets"]] == [4, 3, 2, 1, 0]


def test_plan_table(capsys):
    assert main(["plan", "--max-resource", "27"]) == 0
    out = capsys.readouterr().out
    assert "27 @ 1" in out and "4 @ 27" in out and "49 configs" in out and "1,323" in out


@pytest.fixture
def space_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "space.yaml"
        path.write_text(text)
        return str(path)

    return write


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tune", "--eta", "1"], "--eta: Input should be greater than or equal to 2, got '1'"),
        (["tune", "--max-resource", "nine"], "--max-resource: Input should be a valid integer"),
        (["tune", "--mode", "bohb"], "--mode: Input should be 'hyperband' or 'asha', got 'bohb'"),
        (["tune", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["tune", "--resume", "a", "--job-id", "b"], "--resume a with --job-id b: give one"),
        (["tune", "--resume", "nosuch"], "no job 'nosuch' to resume"),
        (["plan", "--eta", "x"], "--eta: Input should be a valid integer"),
        (["plan", "--min-resource", "5", "--max-resource", "3"], "error: --min-resource must be <= --max-resource"),
        (["scale", "--workers", "0,2"], "--workers: Input should be greater than or equal to 1, got 0"),
        (["tune", "--min-resource", "9", "--max-resource", "3"], "error: --min-resource must be <= --max-resource, got 9 > 3"),
        (["tune", "--data", "no-such-file.csv", "--target", "y"], "data 'no-such-file.csv' not found"),
        (["tune", "--space", "{bad"], 'error: --space: cannot parse its value: Missing end delimiter "}"'),
        (["tune", "--target", "nope"], "target column 'nope' not in the data"),
        (["tune", "--model", "lightgbm"], "unknown model 'lightgbm'; choose xgboost, torch or synthetic"),
        (["tune", "--workers", "0"], "--workers: Input should be greater than or equal to 1, got '0'"),
        (["tune", "--metric", "rmse"], "metric 'rmse' needs a numeric target"),
        (["tune", "--dask-address", "localhost"], "dask_address must look like tcp://host:8786"),
        (["tune", "--space", "missing.yaml"], "search space file 'missing.yaml' not found"),
        (["tune", "--metric", "auc", "--metric", "f1:max"], "metric 'f1': a built-in model reports its quality metric"),
        (["tune", "--metric", "auc", "--metric", "predict_ms:fast"], "direction must be max or min, got 'fast'"),
        (["tune", "--metric", "auc", "--metric", "auc:max"], "metric names must differ, got auc, auc"),
        (["tune", "--metric", "auc:min"], "--metric auc:min: auc is better larger; drop :min"),
        (["tune", "--select", "fastest"], "select must be first, knee or a constraint like predict_ms<=2"),
        (["tune", "--select", "knee"], "error: select 'knee' picks the champion among several objectives; give two "
                                       "or more metric entries"),
        (["tune", "--metric", "auc", "--metric", "predict_ms", "--select", "model_bytes<=9"],
         "select constrains 'model_bytes', which is not an objective (val_auc, predict_ms)"),
        (["tune", "--workers", "2", "--gpus", "0"], "--workers 2: model 'xgboost' trains on this machine's CPUs"),
        (["tune", "--model", "torch", "--workers", "2", "--gpus", "0"],
         "--workers 2 puts a rank on each of 2 GPUs of one host, but --gpus gives 1"),
        (["tune", "--model", "synthetic", "--device", "cuda"], "model 'synthetic' trains on the CPU only"),
        (["tune", "--gpus", "0,x"], "--gpus takes GPU ids separated by commas"),
        (["plan", "--workers", "3", "--gpus", "0,1"], "--workers 3 puts a rank on each of 3 GPUs of one host"),
        (["tune", "--model", "function", "--trainer", "t.py:train", "--metric", "loss:min", "--metric", "ms",
          "--space", '{"x": {"type": "float", "low": 0, "high": 1}}'], "metric 'ms': with several objectives each needs its direction, e.g. ms:min"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tune", "--direction", "minimize"], "--direction minimize: auc is better larger; drop --direction"),
        (["tune", "--metric", "loss"], "unknown metric 'loss'; choose one of auc, accuracy, rmse, logloss"),
        (["tune", "--model", "synthetic", "--metric", "auc"], "--metric auc: the synthetic model reports loss only"),
        (["tune", "--max-trials", "5"], "--max-trials (5) is ASHA's; Hyperband's brackets set their own configs"),
        (["tune", "--target-score", "nan"], "--target-score: Input should be a finite number, got 'nan'"),
        (["tune", "--model", "synthetic", "--unit-seconds", "1e309"], "--unit-seconds: Input should be a finite number"),
        (["tune", "--storage", "memory://jobs"], "--storage memory://jobs: fsspec's memory:// lives in this process only"),
        (["tune", "--experiment", "team/churn"], "--experiment 'team/churn' also names the registered model: Invalid "
                                                 "model name 'team/churn'. Names cannot contain '/' or ':'; choose"),
        (["tune", "--data", "digits", "--target", "label"], "--target label: digits has its own target; drop --target"),
        (["tune", "--nest-under", "0123abcd"], "--nest-under 0123abcd: no such MLflow run in sqlite:////"),
        (["tune", "--data", "folder"], "data 'folder': no CSV or Parquet file in that folder"),
        (["tune", "--data", "inf.csv", "--target", "y"], "target column 'y' has 1 infinite value(s)"),
        (["tune", "--data", "flat.csv", "--target", "y"], "target column 'y' has a single value; nothing to learn"),
        (["tune", "--space", "wide.yaml"], "search space: colsample_bytree=1.5: XGBoost refuses it: value 1.5 for "
                                           "Parameter colsample_bytree exceed bound [0,1]"),
        (["tune", "--model", "synthetic", "--space", "wide.yaml"], "unknown parameter 'colsample_bytree' for synthetic"),
        (["tune", "--model", "synthetic", "--space", "far.yaml"], "search space: x=5.0: x must be a number in [0, 1]"),
        (["scale", "--model", "synthetic", "--space", "far.yaml"], "error: search space: x=5.0"),  # no size blamed
        (["tune", "--job-dir", "afile"], "--job-dir afile: "),
        (["tune", "--warm-start", "nosuch"], "--warm-start nosuch: no job 'nosuch'"),
        (["tune", "--job-id", ".."], "--job-id: '..' is no folder of its own under --job-dir; name the job"),
        (["tune", "--resume", "."], "'.' is no folder of its own under --job-dir"),
    ],
)
def test_input_a_fuzz_of_the_cli_found_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    """Each was taken before (some failed every trial, some tracebacked at the end, some were silently ignored)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    rows = "".join(f"{i % 7},{i * 0.37:.2f}\n" for i in range(30))
    (tmp_path / "inf.csv").write_text("x,y\n" + rows + "1,inf\n")
    (tmp_path / "flat.csv").write_text("x,y\n" + "".join(f"{i},0.5\n" for i in range(30)))
    (tmp_path / "wide.yaml").write_text("colsample_bytree: {type: float, low: 1.5, high: 2.0}\n")
    (tmp_path / "far.yaml").write_text("x: {type: float, low: 5, high: 6}\n")
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not list(tmp_path.glob("hyperband-jobs/*"))  # no job folder left by a refused job


def _help(command: str) -> str:
    from prefect_hyperband.app.flags import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return " ".join(sub.format_help().split())


def test_tune_help_is_generated_every_field_once_with_its_description():
    from prefect_hyperband.flows.params import TuneParams

    text = _help("tune")
    for name, field in TuneParams.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert f"{flag} " in text or f"{flag}]" in text, flag
        if name != "resume":  # --resume JOB: the CLI spelling of resume=True, job_id=JOB, with its own help
            assert " ".join(field.description.split()) in text, name
    assert text.count("[--max-resource") == 1 and "[--baseline | --no-baseline]" in text


def test_a_field_added_to_tune_params_is_a_flag_with_no_other_edit(capsys, monkeypatch):
    from pydantic import Field

    from prefect_hyperband.app import cli, flags
    from prefect_hyperband.app.cli import job_params
    from prefect_hyperband.app.flags import build_parser, given
    from prefect_hyperband.flows import params

    class Mine(params.TuneParams):
        warmup_units: int = Field(2, ge=0, description="Units of learning-rate warm-up before the first rung.")

    for module in (params, flags, cli):  # as if the field were written in TuneParams
        monkeypatch.setattr(module, "TuneParams", Mine)
    assert "--warmup-units N Units of learning-rate warm-up before the first rung." in _help("tune")
    args = build_parser().parse_args(["tune", "--warmup-units", "5", "--max-resource", "9", "--no-baseline"])
    params = job_params(given(args))
    assert isinstance(params, Mine)
    assert (params.warmup_units, params.max_resource, params.baseline, params.eta) == (5, 9, False, 3)
    assert params.model_fields_set == {"warmup_units", "max_resource", "baseline"}
    assert main(["tune", "--warmup-units", "-1"]) == 2
    assert capsys.readouterr().err.strip() == ("hyperband: error: --warmup-units: Input should be greater than or "
                                               "equal to 0, got '-1'")


def test_help_names_each_value_for_what_it_is_not_its_python_type():
    import re

    text = _help("tune")
    for shown in ("--job-dir PATH", "--tracking-uri URL", "--time-budget SECONDS", "--metric NAME[:max|min]",
                  "--space PATH|JSON", "--concurrency N", "--resume JOB", "--mode {hyperband,asha}"):
        assert shown in text, shown
    assert not re.search(r"--[a-z-]+ (int|str|float|\{str,JSON\}|\{list\[str\],str\})[ \]]", text)
    assert "--workers N,N,..." in _help("scale")


def test_only_the_flags_given_are_fields_set_so_a_resume_can_tell_them_apart():
    from prefect_hyperband.app.flags import build_parser, given

    args = build_parser().parse_args(["tune", "--seed", "4", "--no-register-model", "--space", '{"eta": {"type": "float", "low": 0.1, "high": 0.3}}'])
    assert given(args) == {"seed": "4", "register_model": False,
                           "space": {"eta": {"type": "float", "low": 0.1, "high": 0.3}}}
    assert given(build_parser().parse_args(["scale", "--workers", "1,2,4"])) == {"workers": [1, 2, 4]}
    several = build_parser().parse_args(["tune", "--metric", "val_auc:max", "--metric", "predict_ms:min"])
    assert given(several) == {"metric": ["val_auc:max", "predict_ms:min"]}
    for negative in ("-1e-3", "-2E+1", "-.5", "-3"):  # argparse took a negative in exponent form for a flag
        assert given(build_parser().parse_args(["tune", "--target-score", negative])) == {"target_score": negative}


@pytest.mark.parametrize(
    "space, message",
    [
        ("eta: {type: float, low: 0.5, high: 0.1}\n", "eta: low must be < high"),
        ("eta: {type: float, low: 0, high: 1, log: true}\n", "log scale needs low > 0"),
        ("depth: {type: int, low: 1, high: 3}\n", "unknown parameter 'depth' for xgboost"),
        ("eta: {type: gaussian}\n", "type must be one of float, int, categorical"),
    ],
)
def test_bad_space_is_one_line_and_exit_2(space, message, space_file, capsys, tmp_path, monkeypatch):
    path = space_file(space)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--space", path]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_prior_first_without_a_prior_in_the_space_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--model", "synthetic", "--prior-first"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--prior-first trains the space's priors first, but no parameter of the space has one" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["soon", "-3", "0", "inf"])
@pytest.mark.parametrize("name, default", [("HYPERBAND_STOP_GRACE", 8), ("HYPERBAND_SERVER_START_TIMEOUT", 300)])
def test_seconds_from_the_environment_that_are_no_number_of_seconds_are_one_line_and_exit_2(name, default, value, capsys,
                                                                                           tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    assert main(["tune", "--model", "synthetic"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{name}={value!r}: not a number of seconds above 0 (unset, it is {default})" in err
    assert len(err.splitlines()) == 1


def test_a_prefect_server_that_does_not_start_in_time_is_one_line_and_exit_75(capsys, tmp_path, monkeypatch):
    """Past ``HYPERBAND_SERVER_START_TIMEOUT`` the job ends before any training with the server's one line (no
    traceback) and the exit code of a temporary failure: the same command, run again, goes on from its start."""
    from prefect_hyperband.flows import process

    def late(launched=None, say=None):
        raise process.ServerNotStarted("Prefect's temporary server did not answer within 2 s "
                                       "(HYPERBAND_SERVER_START_TIMEOUT; ...)")

    class Launched:
        def cancel(self):
            raise AssertionError("the input was good")

    monkeypatch.setattr(process, "launch_temporary_server", Launched)
    monkeypatch.setattr(process, "temporary_server", late)
    monkeypatch.setenv("HYPERBAND_NO_LIVE", "1")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--model", "synthetic", "--max-resource", "3"]) == 75
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("hyperband: error: Prefect's temporary server did not answer within 2 s "
                       "(HYPERBAND_SERVER_START_TIMEOUT; ...)")
    assert not any("Traceback" in line for line in err)


def test_bad_input_never_prints_a_traceback_from_the_installed_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--data", str(tmp_path / "x.csv"), "--target", "y"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("hyperband: error: data ")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_trial_pool_without_a_prefect_server_for_its_workers_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--trial-pool", "gpus"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**env, "PREFECT_HOME": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("hyperband: error: --trial-pool gpus: the pool's workers and this job need one "
                                   "Prefect server; set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api after "
                                   "`prefect server start`)")


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_tune_printed_to_a_file_is_short_no_task_run_lines_one_summary(tmp_path):
    """Non-TTY output (CI, logs): the job's own lines and the summary once; Prefect's per-task-run lines stay in its UI."""
    import os

    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    for name in ("PREFECT_API_URL", "PREFECT_LOGGING_LEVEL", "MLFLOW_LOGGING_LEVEL"):
        env.pop(name, None)  # the CLI starts its own temporary server and logs at its levels, as for a user
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--max-resource", "9",
             "--no-register-model", "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env, timeout=300,
        )
    text = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, text
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert not [line for line in lines if "Task run" in line], text
    assert sum("model quality" in line for line in lines) == 1, text  # the summary table, once
    assert "━" not in text  # no live display into a file
    # MLflow's and Prefect's own INFO lines (a new store's tables, the temporary server) are the job log's; the job's
    # own line on a first start's wait (a fresh PREFECT_HOME: the suite's own) may be there
    theirs = [line for line in lines if not line.startswith("hyperband: waiting for Prefect's temporary server")]
    assert not [line for line in theirs if "mlflow.store" in line or "temporary server" in line], text
    assert "MLflow UI: mlflow server --backend-store-uri sqlite:///" in text
    [log] = list((tmp_path / "jobs").glob("*/job.log"))
    logged = log.read_text()
    assert "Creating initial MLflow database tables" in logged and "Starting temporary server" in logged
    assert "bracket s=2 rung 1/3" in logged  # the job's own lines too


def test_a_prefect_server_restart_is_one_warning_line_on_the_terminal_not_tracebacks():
    """Prefect's event stream dropping (websockets' keepalive error, with a traceback) and its EventsWorker failing
    at exit with nothing pending (on prefect._internal's own handler): one warning line, once."""
    import logging

    from prefect_hyperband.app.terminal import _TerminalFilter

    said: list[str] = []
    hyperband = logging.getLogger("prefect_hyperband")
    catch = logging.Handler()
    catch.emit = lambda record: said.append(record.getMessage())
    hyperband.addHandler(catch)
    try:
        terminal = _TerminalFilter()
        try:
            raise ConnectionError("no close frame received or sent")
        except ConnectionError:
            import sys

            dropped = logging.LogRecord("websockets.client", logging.ERROR, "", 0, "keepalive ping failed", (),
                                        sys.exc_info())
        worker = logging.LogRecord("prefect._internal.concurrency", logging.ERROR, "", 0,
                                   "Service 'EventsWorker' failed with 0 pending items.", (), None)
        lost = logging.LogRecord("prefect._internal.concurrency", logging.ERROR, "", 0,
                                 "Service 'EventsWorker' failed with 3 pending items.", (), None)
        assert [terminal.filter(r) for r in (dropped, dropped, worker, lost)] == [False, False, False, True]
        # its reconnections failed: Prefect's long warning each time it sends, one line of ours once
        unable = logging.LogRecord(
            "prefect.events.clients", logging.WARNING, "", 0, "Unable to connect to %r. Please check your network "
            "settings to ensure websocket connections to the API are allowed. Otherwise event data (including task "
            "run data) may be lost. Reason: %s. Set PREFECT_DEBUG_MODE=1 to see the full error.",
            ("ws://127.0.0.1:4200/api/events/in", "[Errno 111] Connect call failed ('127.0.0.1', 4200)"), None)
        assert [terminal.filter(unable), terminal.filter(unable)] == [False, False]
        # each event its server was away for: Prefect's error line with the whole event, none of ours (said above)
        item = logging.LogRecord("prefect._internal.concurrency", logging.ERROR, "", 0,
                                 "Service %r failed to process item %r", ("EventsWorker", "Event(event='x')"), None)
        assert [terminal.filter(item), terminal.filter(item)] == [False, False]
        alone = _TerminalFilter()  # the same, its first sign: one line of ours
        assert [alone.filter(item), alone.filter(item), alone.filter(unable)] == [False, False, False]
    finally:
        hyperband.removeHandler(catch)
    assert said == ["the Prefect API's event stream dropped (ConnectionError: no close frame received or sent); "
                    "Prefect's client reconnects and sends its events again",
                    "the Prefect API's event stream could not reconnect to ws://127.0.0.1:4200/api/events/in "
                    "([Errno 111] Connect call failed ('127.0.0.1', 4200)); task runs of that moment may be missing in "
                    "the Prefect UI (every result is in MLflow and the job's state)",
                    "the Prefect API's event stream could not send an event (its server away); task runs of that "
                    "moment may be missing in the Prefect UI (every result is in MLflow and the job's state)"]


def test_a_job_whose_every_trial_failed_ends_in_one_line_and_exit_2(capsys):
    """Nothing tuned: the user's code fails on every config. The summary (or JSON) is printed, then one line."""
    from types import SimpleNamespace

    from prefect.states import Completed, Failed

    from prefect_hyperband.app import cli

    result = {"job_id": "j", "job_dir": "/jobs/j", "summary": {"failed_trials": 5}, "best": None,
              "every_trial_failed": "s1-0000: ValueError: x"}
    params, args = SimpleNamespace(job_id="j"), SimpleNamespace(json=True)
    assert cli._ended(Failed(message="every trial failed (5), the first with s1-0000: ValueError: x", data=result),
                      params, args) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["best"] is None
    assert err.strip() == ("hyperband: error: every trial failed (5), the first with s1-0000: ValueError: x (each "
                           "traceback: /jobs/j/job.log); fix it and run the job again")
    assert cli._ended(Completed(data={**result, "every_trial_failed": None}), params, args) == 0
    capsys.readouterr()
    assert cli._ended(Failed(message="boom", data=RuntimeError("boom")), params, args) == 1  # the flow's own failure
    assert capsys.readouterr().err.strip() == "hyperband: job failed: boom"


def test_a_failed_trial_rung_is_the_jobs_one_line_on_the_terminal_not_prefects_traceback():
    """A trainer that raises: Prefect's task-run error (with the traceback) stays in job.log and the UI; the terminal
    has the job's "trial T failed at r=R: ..." line. Other task runs' errors (the job's end) still show."""
    import logging

    from prefect_hyperband.app.terminal import _TerminalFilter

    try:
        raise ValueError("bad config handling")
    except ValueError:
        exc_info = sys.exc_info()
    terminal = _TerminalFilter()
    for task in ("train", "evaluate", "finish parent run"):
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, "", 0, "Task run failed with exception", (),
                                   exc_info)
        record.task_name = task
        assert terminal.filter(record) is (task == "finish parent run"), task
    said = logging.LogRecord("prefect.task_runs", logging.WARNING, "", 0, "checkpoint r1.ubj is empty (0 bytes); "
                             "trained it again", (), None)
    said.task_name = "train"
    assert terminal.filter(said)  # a train task's own warning is the user's to see


def test_a_workers_terminal_leaves_out_the_tracebacks_of_trainings_its_stop_ended_and_keeps_other_errors():
    """``hyperband worker`` stopped (SIGTERM) mid-training: each training ends with ``Stopped``, which Prefect logs as
    a task run's error with its traceback, then a "Finished in state Failed(...Stopped...)" line: neither is an error.
    A trainer's own failure still shows."""
    import logging

    from prefect_hyperband.app.terminal import _StopsFilter
    from prefect_hyperband.trainers.stopping import Stopped

    def record(message, exc, name="prefect.task_runs"):
        try:
            raise exc
        except Exception:
            return logging.LogRecord(name, logging.ERROR, "", 0, message, (), sys.exc_info())

    stops = _StopsFilter()
    assert not stops.filter(record("Task run failed with exception: Stopped('the job is stopping')",
                                   Stopped("the job is stopping")))
    finished = logging.LogRecord("prefect.task_runs", logging.ERROR, "", 0, "Finished in state Failed('Task run "
                                 "encountered an exception Stopped: the job is stopping')", (), None)
    assert not stops.filter(finished)
    assert stops.filter(record("Task run failed with exception: ValueError('bad')", ValueError("bad")))
    assert stops.filter(record("Stopped the server", Stopped("x"), name="prefect.server"))


def test_the_writer_started_ahead_is_of_the_kind_the_job_resolves(monkeypatch):
    """The CLI decides before the flow whether to start the job's MLflow writer process ahead: with the slots the job
    will have, given or from the cores (a 64-core machine's default job writes from a process), and, on a work pool
    or a Dask cluster, whose size only the flow asks for, the slots given or one."""
    from prefect_hyperband.app.cli import _writer_ahead
    from prefect_hyperband.flows.params import TuneParams

    monkeypatch.delenv("HYPERBAND_MLFLOW_WRITER", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert _writer_ahead(TuneParams(model="synthetic")) == "process"
    assert _writer_ahead(TuneParams(model="synthetic", concurrency=2)) == "thread"
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _writer_ahead(TuneParams(model="synthetic")) == "thread"
    assert _writer_ahead(TuneParams(model="synthetic", concurrency=32)) == "process"
    assert _writer_ahead(TuneParams(model="synthetic", dask_address="tcp://127.0.0.1:1")) == "thread"
    assert _writer_ahead(TuneParams(model="synthetic", trial_pool="pool", concurrency=16)) == "process"


def test_prefects_two_console_handlers_share_one_terminal_filter():
    """Prefect's events client warns through the root's console handler and its services' errors go through
    ``prefect._internal``'s own: one filter on both, so a kind of Prefect's lines is said once a job (with a filter
    each, a Prefect server away printed "could not reconnect" and then "could not send an event")."""
    import logging

    from prefect_hyperband.app.terminal import _TerminalFilter, quiet_terminal

    quiet_terminal()
    filtered = [[f for f in h.filters if isinstance(f, _TerminalFilter)]
                for h in [*logging.getLogger().handlers, *logging.getLogger("prefect._internal").handlers]]
    filtered = [fs for fs in filtered if fs]
    assert len(filtered) >= 2 and len({id(f) for fs in filtered for f in fs}) == 1


def test_log_lines_the_prefect_api_did_not_take_are_one_line_of_the_jobs_not_a_raw_write_glued_to_the_next(capsys):
    """Seen under ten jobs on PostgreSQL: Prefect's log worker wrote "--- Error logging to API ---" and "All connection
    attempts failed", with no newline, to stderr for each batch its restarting server did not take; the job's next
    line was glued to it. Now a warning of the job's: each in job.log, once on the terminal."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from prefect.logging.handlers import APILogWorker

    from prefect_hyperband.app.terminal import API_LOGS, _TerminalFilter, quiet_terminal

    async def refused(items):
        raise ConnectionError("All connection attempts failed")

    quiet_terminal()
    records: list[logging.LogRecord] = []
    catch = logging.Handler()
    catch.emit = records.append
    logging.getLogger(API_LOGS).addHandler(catch)
    try:
        worker = SimpleNamespace(_client=SimpleNamespace(create_logs=refused))
        for _ in range(2):
            asyncio.run(APILogWorker._handle_batch(worker, [{"message": "a line"}]))
    finally:
        logging.getLogger(API_LOGS).removeHandler(catch)
    assert "Error logging to API" not in capsys.readouterr().err
    assert [r.getMessage() for r in records] == ["the Prefect API did not take the job's log lines (ConnectionError: "
                                                 "All connection attempts failed); the Prefect UI misses those of "
                                                 "that moment (the terminal and job.log keep them)"] * 2
    terminal = _TerminalFilter()
    assert [terminal.filter(r) for r in records] == [True, False]


def test_bad_input_found_by_the_preflight_kills_the_prefect_server_launched_ahead(capsys, tmp_path, monkeypatch):
    """The job's temporary server starts booting before the preflight reads the data (``flows.process``); input the
    preflight refuses ends the job in one line, exit 2, and the server started for it is killed, not left to boot."""
    from prefect_hyperband.flows import process

    launched: list[str] = []

    class Launched:
        def cancel(self):
            launched.append("cancelled")

    monkeypatch.setattr(process, "launch_temporary_server", lambda: launched.append("launched") or Launched())
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--target", "nope"]) == 2
    assert "target column 'nope' not in the data" in capsys.readouterr().err
    assert launched == ["launched", "cancelled"]


def test_the_cli_leaves_the_heap_of_its_set_up_out_of_the_cyclic_collector_before_its_job_runs(monkeypatch):
    """A full collection over the imports' and the set-up's objects held the GIL 270 to 330 ms during a job's trials
    (every slot waiting): the CLI's one job runs with them frozen (``gc.freeze``)."""
    import gc
    from types import SimpleNamespace

    from prefect_hyperband.app import cli

    frozen: list[int] = []
    monkeypatch.setattr(cli, "_temporary_server", lambda launched: False)
    monkeypatch.setattr(cli, "started", lambda tune, params: frozen.append(gc.get_freeze_count()) or "state")
    monkeypatch.setattr(cli, "_ended", lambda state, params, args, out=None: 0)
    gc.unfreeze()
    try:
        assert cli._job(None, SimpleNamespace(resume=True), SimpleNamespace(verbose=True), None, None) == 0
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 0
