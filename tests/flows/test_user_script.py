"""Tuning the user's own training script under torch's launcher: the DDP example, failures, bad input."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import psutil
import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

ROOT = Path(__file__).resolve().parents[2]
DDP = str(ROOT / "examples" / "ddp_digits.py")
DDP_SPACE = str(ROOT / "examples" / "ddp_space.yaml")

pytestmark = pytest.mark.usefixtures("prefect_harness")


def launchers() -> list[psutil.Process]:
    """Processes of torch's launcher or its ranks still alive (children of this test process)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any("torch.distributed.run" in a or a.endswith(".py") and "ddp" in a for a in p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_the_ddp_example_with_two_workers_trains_exactly_11_epochs_at_world_size_2(tracking_uri, tmp_path, capsys):
    from prefect_hyperband.app import cli

    code = cli.main(["tune", "--script", DDP, "--workers", "2", "--space", DDP_SPACE, "--metric", "val_accuracy",
                     "--direction", "maximize", "--min-resource", "1", "--max-resource", "3", "--eta", "3",
                     "--seed", "1", "--job-dir", str(tmp_path / "jobs"), "--experiment", "ddp", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = result["summary"]
    # (1, 3, 3): 3 configs at 1 epoch, the best continued to 3; 2 more at 3: 6 trial-rungs, 11 epochs
    assert summary["configs"] == 5 and summary["reached_max_resource"] == 3 and summary["resource_used"] == 11
    assert summary["failed_trials"] == 0

    client, _, children = runs_of(tracking_uri, "ddp", result["parent_run_id"])
    assert len(children) == 5 and all(c.info.status == "FINISHED" for c in children)
    # rank 0 reported every epoch it trained, once: resumes trained only the missing epochs
    histories = [client.get_metric_history(c.info.run_id, "val_accuracy") for c in children]
    assert sum(len(h) for h in histories) == 11
    world = [m.value for c in children for m in client.get_metric_history(c.info.run_id, "world_size")]
    assert len(world) == 11 and set(world) == {2.0}  # every trial-rung ran two ranks
    winner = next(c for c in children if c.data.tags["hyperband.trial_id"] == result["best"]["trial_id"])
    assert [m.step for m in client.get_metric_history(winner.info.run_id, "val_accuracy")] == [1, 2, 3]
    assert result["best"]["score"] > 0.8  # digits with a small MLP, 3 epochs
    assert not launchers()  # no launcher or rank left behind

    # the same job on a Dask cluster of two "hosts": each rank a process on a worker of a group, the checkpoint
    # directory and rank 0's reports carried through Dask, the numbers of torch's launcher here
    from dask_cluster import cluster  # tests/dask_cluster.py

    from prefect_hyperband.executors.dask_script import script_on
    from prefect_hyperband.trainers.script import ScriptFailed, ScriptTrainer

    with cluster(["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"], str(tmp_path)) as c:
        code = cli.main(["tune", "--script", DDP, "--workers", "2", "--space", DDP_SPACE, "--metric", "val_accuracy",
                         "--direction", "maximize", "--min-resource", "1", "--max-resource", "3", "--eta", "3",
                         "--seed", "1", "--job-dir", str(tmp_path / "jobs"), "--experiment", "ddp-dask", "--json",
                         "--dask-address", c.address])
        assert code == 0
        remote = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        broken = tmp_path / "broken.py"
        broken.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
                          "sys.exit(4)\n")
        failing = ScriptTrainer(str(broken), "loss", workers=2, timeout=60, placement=script_on(c.address))
        try:
            with pytest.raises(ScriptFailed, match=r"(?s)rank \d .*exited with code 4.*rank \d of 2"):
                failing.train({}, 1, None, str(tmp_path / "broken" / "t0" / "r1.json"))
        finally:
            failing.close()
        # torch's gloo race at exit on Dask: rank 1 aborts after rank 0 exited on its own (kept), or before the
        # work (the trial-rung fails, as on one machine: tests/trainers/test_script.py)
        from race_script import RACE_SCRIPT  # tests/race_script.py

        (tmp_path / "race.py").write_text(RACE_SCRIPT)
        racing = ScriptTrainer(str(tmp_path / "race.py"), "loss", workers=2, timeout=60, placement=script_on(c.address))
        try:
            kept = racing.train({"when": "after"}, 3, None, str(tmp_path / "race" / "t0" / "r3.json"))
            assert kept.info["exit_race_rank"] == 1.0 and kept.history[-1] == {"step": 3.0, "loss": 1.0 / 3}
            with pytest.raises(ScriptFailed, match=r"rank \d"):
                racing.train({"when": "before"}, 3, None, str(tmp_path / "race" / "t1" / "r3.json"))
        finally:
            racing.close()
        # issue 79 on Dask: an FSDP2 script's rank 0 aborts after destroy_process_group(); the DCP parts of both
        # ranks come back, the result stands with rank 0 named
        from abort_scripts import FSDP_SCRIPT  # tests/abort_scripts.py

        (tmp_path / "fsdp.py").write_text(FSDP_SCRIPT)
        fsdp = ScriptTrainer(str(tmp_path / "fsdp.py"), "val_loss", workers=2, timeout=120,
                             placement=script_on(c.address))
        try:
            kept = fsdp.train({"abort": "after0"}, 1, None, str(tmp_path / "fsdp" / "t0" / "r1.json"))
            assert kept.info["exit_race_rank"] == 0.0 and "a part from each of 2 rank(s)" in kept.info["exit_kept"]
        finally:
            fsdp.close()
    assert remote["summary"]["concurrency"] == 2 and remote["summary"]["failed_trials"] == 0
    here, there = rows(result), rows(remote)
    assert here.keys() == there.keys() and len(here) == 6
    assert all(abs(here[k] - there[k]) <= 1e-6 for k in here), (here, there)
    _, _, children = runs_of(tracking_uri, "ddp-dask", remote["parent_run_id"])
    world = [m.value for c in children for m in client.get_metric_history(c.info.run_id, "world_size")]
    assert len(world) == 11 and set(world) == {2.0}


def rows(result: dict) -> dict[tuple[str, int], float]:
    saved = json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]
    return {(r["trial_id"], r["resource"]): r["score"] for r in saved}


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "train_script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.slow  # processes end to end (the fast tier keeps its loop behaviours on fakes)
def test_a_failing_script_fails_its_trial_with_the_last_lines_of_its_output(tracking_uri, tmp_path, capsys):
    """Non-zero exit, a missing report, a NaN: each fails that trial only, with the reason on its child run."""
    from prefect_hyperband.app import cli

    path = script(tmp_path, """
        import argparse, os, sys
        import prefect_hyperband as hb
        p = argparse.ArgumentParser(); p.add_argument("--x", type=float); x = p.parse_args().x
        r = int(os.environ["HYPERBAND_RESOURCE"])
        if x < 0.25:
            print("loading the data... out of memory", file=sys.stderr); sys.exit(3)
        if x < 0.5:
            hb.report(r - 1, loss=x)  # not at HYPERBAND_RESOURCE
        elif x < 0.75:
            hb.report(r, loss=float("nan"))
        else:
            hb.report(r, loss=x / r)
    """)
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    code = cli.main(["tune", "--script", path, "--space", str(space), "--metric", "loss", "--direction", "minimize",
                     "--max-resource", "3", "--eta", "3", "--seed", "4", "--job-dir", str(tmp_path / "jobs"),
                     "--experiment", "failing-script", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    client, _, children = runs_of(tracking_uri, "failing-script", result["parent_run_id"])
    by_x = {float(c.data.params["x"]): c for c in children}
    reasons = {x: c.data.tags.get("hyperband.error", "") for x, c in by_x.items()}
    bins = {min(int(x * 4), 3) for x in by_x}
    assert bins == {0, 1, 2, 3}  # seed 4: every kind of failure and a success
    for x, c in by_x.items():
        if x < 0.25:
            assert c.info.status == "FAILED" and "exited with code 3" in reasons[x] and "out of memory" in reasons[x]
        elif x < 0.5:
            assert c.info.status == "FAILED" and "reported no 'loss' at step" in reasons[x]
        elif x < 0.75:
            assert c.info.status == "FAILED" and "nan" in reasons[x]
        else:
            assert c.info.status == "FINISHED" and not reasons[x]
    assert result["summary"]["failed_trials"] == sum(x < 0.75 for x in by_x)
    assert result["best"]["config"]["x"] >= 0.75


@pytest.mark.slow  # processes end to end
def test_a_job_given_gpus_0_1_runs_two_trials_at_once_each_on_its_own_gpu(tracking_uri, tmp_path, capsys, monkeypatch):
    """Issue 76, on a CPU machine: every trial-rung's script sees CUDA_VISIBLE_DEVICES of one GPU, two run at once on
    different GPUs, and the summary counts GPU-seconds."""
    from prefect_hyperband.app import cli

    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SEEN_FILE", str(seen))
    path = script(tmp_path, """
        import json, os, time
        import prefect_hyperband as hb
        began = time.time()
        time.sleep(0.4)
        with open(os.environ["SEEN_FILE"], "a") as f:
            f.write(json.dumps([os.environ["CUDA_VISIBLE_DEVICES"], began, time.time()]) + "\\n")
        hb.report(int(os.environ["HYPERBAND_RESOURCE"]), loss=1.0 / int(os.environ["HYPERBAND_RESOURCE"]))
    """)
    space = tmp_path / "space.yaml"
    space.write_text("x: {type: float, low: 0.0, high: 1.0}\n")
    code = cli.main(["tune", "--script", path, "--space", str(space), "--metric", "loss", "--direction", "minimize",
                     "--max-resource", "3", "--eta", "3", "--gpus", "0,1", "--job-dir", str(tmp_path / "jobs"),
                     "--experiment", "gpu-script", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(rows) == summary["trial_rungs"] == 6 and {r[0] for r in rows} == {"0", "1"}
    overlapping = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:] if a[1] < b[2] and b[1] < a[2]]
    assert overlapping and all(a[0] != b[0] for a, b in overlapping)  # at once: never on one GPU
    assert summary["concurrency"] == 2 and summary["gpus_per_trial"] == 1 and summary["gpu_seconds"] > 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--script", "nosuch.py"], "--script 'nosuch.py' is not a file"),
        (["--script", DDP, "--trainer", f"{ROOT / 'examples' / 'sklearn_sgd.py'}:train"], "--trainer and --script together"),
        (["--script", DDP, "--metric", "val_accuracy", "--direction", "maximize"], "your own script needs space"),
        (["--script", DDP, "--space", DDP_SPACE, "--direction", "maximize"], "your own script needs metric"),
        (["--script", DDP, "--space", DDP_SPACE, "--metric", "val_accuracy", "--direction", "maximize",
          "--workers", str((os.cpu_count() or 1) + 1)], "local worker processes per trial"),
        (["--script", DDP, "--space", DDP_SPACE, "--metric", "val_accuracy", "--direction", "maximize",
          "--workers", "2", "--gpus", "0"], "--workers 2 puts a rank on each of 2 GPUs of one host, but --gpus gives 1"),
    ],
)
def test_bad_script_input_is_one_line_and_exit_2(tracking_uri, tmp_path, capsys, extra, message):
    from prefect_hyperband.app import cli

    if "nosuch.py" in extra:
        extra = extra + ["--space", DDP_SPACE, "--metric", "m", "--direction", "minimize"]
    code = cli.main(["tune", "--job-dir", str(tmp_path / "jobs"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("hyperband: error: "), err
    assert message in err
