"""The user's own training function: loading it, the Trial it gets, what it must return (plain Python)."""

from __future__ import annotations

import json
import math
import sys

import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers.function import FunctionTrainer, Trial, entry_of, load, report


def write(tmp_path, body: str, name: str = "user_train.py"):
    path = tmp_path / name
    path.write_text(body)
    return path


COUNTING = """
import json, os
from pathlib import Path

def train(trial):
    done = Path(trial.checkpoint) / "epochs.json" if trial.checkpoint else None
    epochs = json.loads(done.read_text()) if done else []
    for e in range(trial.start + 1, trial.resource + 1):
        epochs.append(e)
        trial.report(e, loss=1.0 / e)
    (Path(trial.checkpoint_dir) / "epochs.json").write_text(json.dumps(epochs))
    return {"loss": 1.0 / trial.resource + trial.config["x"], "epochs": len(epochs)}
"""


def test_a_trial_resumes_from_its_checkpoint_and_trains_only_the_missing_units(tmp_path):
    trainer = FunctionTrainer(f"{write(tmp_path, COUNTING)}:train", "loss")
    first = trainer.train({"x": 0.5}, 3, None, str(tmp_path / "ck" / "t" / "r3.json"))
    assert first.resource_trained == 3 and [h["step"] for h in first.history] == [1, 2, 3]
    assert trainer.evaluate(first.checkpoint) == pytest.approx(1 / 3 + 0.5)
    second = trainer.train({"x": 0.5}, 9, first.checkpoint, str(tmp_path / "ck" / "t" / "r9.json"))
    assert second.resource_trained == 6 and [h["step"] for h in second.history] == [4, 5, 6, 7, 8, 9]
    assert json.loads((tmp_path / "ck" / "t" / "r9" / "epochs.json").read_text()) == list(range(1, 10))
    assert json.loads((tmp_path / "ck" / "t" / "r9.json").read_text())["metrics"]["epochs"] == 9


@pytest.mark.parametrize(
    "body, message",
    [
        ("def train(trial):\n    return {'other': 1.0}\n", "returned no 'loss'"),
        ("def train(trial):\n    return {'loss': float('nan')}\n", "'loss' is nan"),
        ("def train(trial):\n    return {'loss': 'low'}\n", "must be a number"),
        ("def train(trial):\n    return 0.5\n", "must return a dict"),
        ("def train(trial):\n    raise RuntimeError('diverged')\n", "diverged"),
    ],
)
def test_what_a_trainer_returns_is_checked(tmp_path, body, message):
    trainer = FunctionTrainer(f"{write(tmp_path, body)}:train", "loss")
    with pytest.raises(Exception, match=message):
        trainer.train({}, 1, None, str(tmp_path / "r1.json"))


@pytest.mark.parametrize(
    "entry, message",
    [
        ("nosuch.py:train", "trainer file 'nosuch.py' not found"),
        ("no_colon.py", "must be path/to/file.py:function or package.module:function"),
        ("no_such_package_xyz.mod:train", "does not import: ModuleNotFoundError"),
        ("{bad}:train", "does not import: ModuleNotFoundError: No module named .no_such_module_xyz."),
        ("{missing}:train", "has no function 'train'"),
        ("{two_args}:train", "must take one argument, the trial"),
    ],
)
def test_bad_trainers_are_one_clear_error(tmp_path, entry, message):
    files = {
        "bad": write(tmp_path, "import no_such_module_xyz\n", "bad.py"),
        "missing": write(tmp_path, "def other(trial):\n    return {}\n", "missing.py"),
        "two_args": write(tmp_path, "def train(trial, extra):\n    return {}\n", "two_args.py"),
    }
    entry = entry.format(**{k: str(v) for k, v in files.items()})
    with pytest.raises(InputError, match=message):
        load(entry)


def test_a_module_that_exits_or_parses_flags_on_import_is_imported_as_a_library(tmp_path):
    """Found by a fuzz of the CLI: ``sys.exit`` at a module's top level ended the job with exit 1 and no line of
    ours; an ``argparse`` parser there read hyperband's own flags and refused them as if hyperband had."""
    exits = write(tmp_path, "import sys\nsys.exit('bye')\ndef train(trial):\n    return {}\n", "exits.py")
    with pytest.raises(InputError, match=r"exits.py' does not import: its top-level code exited \(sys.exit\('bye'\)\); "
                                         r"put what runs as a script under if __name__ == '__main__':"):
        load(f"{exits}:train")
    parses = write(tmp_path, "import argparse, sys\nARGV = list(sys.argv)\np = argparse.ArgumentParser()\n"
                             "p.add_argument('--lr', type=float, default=0.1)\nARGS = p.parse_args()\n"
                             "def train(trial):\n    return {'lr': ARGS.lr}\n", "parses.py")
    argv = list(sys.argv)
    fn = load(f"{parses}:train")
    assert fn(None) == {"lr": 0.1} and fn.__globals__["ARGV"] == [str(parses)]
    assert sys.argv == argv  # given back


def test_an_async_or_generator_training_function_is_refused_before_it_fails_every_trial():
    async def coroutine(trial):
        return {"loss": 0.0}

    def generator(trial):
        yield {"loss": 0.0}

    for fn, kind in ((coroutine, "an async def"), (generator, "a generator")):
        with pytest.raises(InputError, match=f"is {kind} function; it must return its metrics"):
            load(entry_of(fn))


@pytest.mark.parametrize("raised", [SystemExit(0), SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_sys_exit_or_a_keyboard_interrupt_raised_by_the_code_fails_its_trial_not_the_job(raised):
    """Found by a fuzz: ``sys.exit(0)`` in ``train`` ended the CLI with exit 0 and no summary, ``KeyboardInterrupt``
    with "interrupted" though no signal came, each with the job's runs left RUNNING."""
    from prefect_hyperband.trainers.function import Trial, call

    def train(trial):
        raise raised

    with pytest.raises(RuntimeError, match=rf"the training function raised {type(raised).__name__}\(.*\); it ends "
                                           "this trial only"):
        call(train, Trial({}, 1, 0, None, "."))


@pytest.mark.parametrize("name, message", [("bad name!/..", "Names may only contain alphanumerics"),
                                           ("m" * 300, "300 characters, MLflow takes at most 250")])
def test_a_metric_name_mlflow_refuses_fails_the_report_not_minutes_of_retried_writes(name, message):
    """Found by a fuzz: MLflow's 400 for such a name was taken for a server in trouble; the (1, 3, 3) job took 328 s,
    each trial trained three times."""
    from prefect_hyperband.trainers.function import Trial

    with pytest.raises(ValueError, match=rf"trial.report: metric .*{message}"):
        Trial({}, 1, 0, None, None).report(1, **{name: 1.0})


def test_module_entries_and_local_functions_load():
    assert load("json:dumps") is json.dumps

    def local(trial):
        return {"loss": 0.0}

    assert load(entry_of(local)) is local
    assert entry_of(math.sqrt).startswith("<local>:") or entry_of(math.sqrt) == "math:sqrt"


def test_report_outside_a_trial_says_so_and_inside_lands_on_the_trial(tmp_path):
    with pytest.raises(RuntimeError, match="outside a trial"):
        report(1, loss=0.5)
    body = "import prefect_hyperband as hb\ndef train(trial):\n    hb.report(1, loss=0.25)\n    return {'loss': 0.25}\n"
    result = FunctionTrainer(f"{write(tmp_path, body)}:train", "loss").train({}, 1, None, str(tmp_path / "r1.json"))
    assert result.history == [{"step": 1, "loss": 0.25}]
    with pytest.raises(TypeError, match="must be a number"):
        Trial({}, 1, 0, None, str(tmp_path)).report(1, loss="x")
