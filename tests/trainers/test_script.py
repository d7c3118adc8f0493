"""The script trainer's failure reasons, read from the launcher's log (no launcher started)."""

from __future__ import annotations

from pathlib import Path

from prefect_hyperband.trainers.script import SHUTDOWN_HINT, _failure

LAUNCHER = ("E1125 12:36:25.039000 2639 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) "
            "local_rank: 1 (pid: 2642) of binary: /usr/bin/python\nTraceback (most recent call last):\n  File x\n")


def test_a_failed_rank_is_named_with_its_exit_code_and_the_lines_before_the_launchers_report(tmp_path: Path):
    log = tmp_path / "out.log"
    log.write_text("epoch 1: loss 0.5\nValueError: bad\n" + LAUNCHER)
    reason = _failure(1, log)
    assert reason == "exited with code -6 (local rank 1); last output:\nepoch 1: loss 0.5\nValueError: bad"


def test_an_abort_at_interpreter_exit_says_how_to_end_the_script(tmp_path: Path):
    """torch 2.13's gloo can abort a rank after its work, while Python shuts down: the reason says what to do."""
    log = tmp_path / "out.log"
    log.write_text("epoch 3: val_accuracy 0.9\nterminate called without an active exception\n" + LAUNCHER)
    reason = _failure(1, log)
    assert reason.startswith("exited with code -6 (local rank 1); last output:\nepoch 3: val_accuracy 0.9\nterminate")
    assert reason.endswith(SHUTDOWN_HINT) and "os._exit(0)" in SHUTDOWN_HINT


def test_a_script_with_no_launcher_report_gives_the_launchers_code(tmp_path: Path):
    log = tmp_path / "out.log"
    log.write_text("")
    assert _failure(3, log) == "exited with code 3; last output:\n(no output)"
    assert _failure(3, tmp_path / "missing.log") == "exited with code 3; last output:\n(no output)"
