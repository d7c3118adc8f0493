"""The executor of this process's threads: a trial-rung runs in the context its place gives (its group's subflow
run), and its place is let go however the work ends."""

from __future__ import annotations

import contextvars
import gc
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from concurrent.futures import Future

import pytest

from prefect_hyperband.executors.threads import RealClock, ThreadExecutor
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
        from prefect_hyperband.executors.threads import RealClock, ThreadExecutor, stuck
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


def test_the_clock_hands_out_the_futures_that_ended_and_keeps_none_it_handed_out():
    clock = RealClock()
    early, late, never = Future(), Future(), Future()
    early.set_result(1)
    assert clock.wait([early, late, never], 5.0) == {early}  # done before it was waited on
    began = time.monotonic()
    threading.Timer(0.2, late.set_result, (2,)).start()
    assert clock.wait([late, never], 5.0) == {late}  # woken by its end, long before the timeout
    assert time.monotonic() - began < 4.0
    assert clock.wait([never], 0.1) == set()
    gone = weakref.ref(early)
    del early
    gc.collect()
    assert gone() is None  # a future handed out is not kept by the clock (a job's memory would grow by each)
    dropped = Future()
    clock.wait([dropped, never], 0.01)
    dropped.set_result(3)  # ended after the caller stopped waiting for it: forgotten at the next wait
    assert clock.wait([never], 0.01) == set()
    assert clock.wait([dropped], 0.01) == {dropped}  # and found again if it is waited for once more


def test_idle_threads_take_the_next_trial_rungs_and_shutdown_ends_and_joins_them():
    gate = threading.Event()
    executor = ThreadExecutor(lambda trial_rung: gate.wait(10) and trial_rung.trial_id, StopToken())
    futures = [executor.submit(_trial_rung(i)) for i in range(3)]
    threads = set(executor.threads)
    assert len(threads) == 3  # none idle while three are held: one thread each
    gate.set()
    assert [f.result() for f in futures] == ["0000", "0001", "0002"]
    assert [executor.submit(_trial_rung(i)).result() for i in range(3, 6)] == ["0003", "0004", "0005"]
    assert executor.threads == threads  # idle threads take the next trial-rungs: none started for them
    executor.shutdown(wait=True)
    assert not any(t.is_alive() for t in threads) and executor.threads == set()
