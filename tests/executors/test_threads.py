"""The executor of this process's threads: a trial-rung runs in the context its place gives (its group's subflow
run), and its place is let go however the work ends."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import textwrap

import pytest

from prefect_hyperband.executors.threads import ThreadExecutor
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.stopping import StopToken

WHERE = contextvars.ContextVar("where", default="the job's run")


def _trial_rung(i: int) -> TrialRung:
    return TrialRung(f"{i:04d}", 0, 0, 1, {}, None)


def test_a_trial_rung_runs_in_its_places_context_and_lets_it_go_after():
    released: list[str] = []

    def place(trial_rung):
        if trial_rung.trial_id == "0000":
            return None, lambda: released.append("0000")
        context = contextvars.copy_context()
        context.run(WHERE.set, "bracket s=0")
        return context, lambda: released.append(trial_rung.trial_id)

    def work(trial_rung):
        if trial_rung.trial_id == "0002":
            raise RuntimeError("the API")
        return WHERE.get()

    executor = ThreadExecutor(work, StopToken(), place=place)
    try:
        assert executor.submit(_trial_rung(0)).result() == "the job's run"
        assert executor.submit(_trial_rung(1)).result() == "bracket s=0"
        with pytest.raises(RuntimeError, match="the API"):
            executor.submit(_trial_rung(2)).result()
    finally:
        executor.shutdown(wait=True)
    assert released == ["0000", "0001", "0002"]
    assert WHERE.get() == "the job's run"  # the caller's context untouched


def test_a_process_exits_with_a_training_given_up_on_its_timeout_still_running():
    """Found by a fuzz: after ``hb.tune`` returned, its Python process did not exit while a training given up on
    ``trial_timeout`` still ran (a pool's threads are joined at exit, and Python cannot stop a thread)."""
    script = textwrap.dedent("""
        import threading
        from prefect_hyperband.executors.threads import ThreadExecutor, stuck
        from prefect_hyperband.hyperband.trial import TrialRung
        from prefect_hyperband.trainers.stopping import StopToken

        executor = ThreadExecutor(lambda trial_rung: threading.Event().wait(), StopToken())
        future = executor.submit(TrialRung("0000", 0, 0, 1, {}, None))
        while not stuck() and not executor.began(future):
            pass
        executor.give_up(future)
        executor.shutdown(wait=True)
        print("returned", executor.stuck())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "returned 1", done.stderr
