"""ASHA's importances while results arrive: at most every interval, one computation at a time, off the loop."""

from __future__ import annotations

import threading

from prefect_hyperband.hyperband.importance import Importance
from prefect_hyperband.tasks.importance_report import Live


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_at_most_every_interval_and_one_at_a_time_with_the_results_read_when_due():
    clock, gate, published, reads = Clock(), threading.Event(), [], []

    def compute(results):
        gate.wait(5)
        return Importance("ped-anova", 9, len(results), {"score": {"x": 1.0}})

    live = Live(compute, lambda found, step: published.append((found.results, step)), interval=10, clock=clock,
                count=len)
    results = lambda: reads.append(1) or ["r"] * (3 * len(reads))  # noqa: E731
    live.offer(results)
    assert reads == []  # not due yet: nothing read, nothing computed
    clock.now = 10
    live.offer(results)
    assert len(reads) == 1
    clock.now = 25
    live.offer(results)  # due, but the first is still computing: skipped, not queued
    assert len(reads) == 1
    gate.set()
    live.close()
    assert published == [(3, 3)]
    clock.now = 30
    live.offer(results)
    live.close()
    assert published == [(3, 3), (6, 6)] and live.published == 2


def test_the_imports_are_paid_when_the_job_starts_and_no_computation_starts_before_they_end():
    """``warm`` (the driver's: ``importance_report.preload``) runs at once on the importances' thread; a computation
    due meanwhile is skipped, as while another computes, and starts once the imports are done."""
    clock, gate, published, reads, warmed = Clock(), threading.Event(), [], [], []

    def warm():
        warmed.append(threading.current_thread().name)
        gate.wait(5)

    live = Live(lambda results: Importance("ped-anova", 9, len(results), {"score": {"x": 1.0}}),
                lambda found, step: published.append(step), interval=10, clock=clock, count=len, warm=warm)
    assert warmed == ["hyperband-importance"]  # before any result was offered
    results = lambda: reads.append(1) or ["r"] * 4  # noqa: E731
    clock.now = 10
    live.offer(results)
    assert reads == [] and published == []  # due, but the imports are not done: nothing read
    gate.set()
    live.close()
    clock.now = 20
    live.offer(results)
    live.close()
    assert reads == [1] and published == [4]


def test_imports_that_fail_leave_the_computation_to_say_so(monkeypatch):
    hooked, published = [], []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_type))

    def warm():
        raise ImportError("no optuna")

    clock = Clock()
    live = Live(lambda results: Importance("ped-anova", 9, len(results), {"score": {"x": 1.0}}),
                lambda found, step: published.append(step), interval=10, clock=clock, count=len, warm=warm)
    live.close()
    clock.now = 10
    live.offer(lambda: ["r"])
    live.close()
    assert hooked == [] and published == [1]  # no thread traceback; the computation ran (and would say what failed)


def test_preload_imports_the_evaluators_and_the_charts_backend_in_a_process_that_had_neither():
    import subprocess
    import sys

    probe = ("import sys; from prefect_hyperband.tasks.importance_report import preload; "
             "wanted = ('optuna.importance', 'matplotlib.figure', 'matplotlib.backends.backend_agg'); "
             "before = [m for m in wanted if m in sys.modules]; preload(); "
             "print(before, [m for m in wanted if m not in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[] []", out.stdout  # none imported before it, all imported by it


def test_a_failed_computation_is_kept_for_one_line_and_too_few_results_publish_nothing():
    clock = Clock()
    outcomes = iter([None, ValueError("bad rung")])

    def compute(results):
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    published = []
    live = Live(compute, lambda found, step: published.append(step), interval=1, clock=clock)
    for t in (1, 2):
        clock.now = t
        live.offer(list)
        live.close()
    assert published == [] and live.failed == "ValueError: bad rung"


def test_the_wait_grows_with_what_the_last_computation_cost_to_a_bounded_share_of_the_cpu():
    """A computation that took 2 CPU seconds is followed by one no sooner than 2 / LIVE_SHARE seconds later."""
    from prefect_hyperband.tasks import importance_report

    clock, cpu, published = Clock(), Clock(), []

    def compute(results):
        cpu.now += 2.0  # what PED-ANOVA on many results, the chart and the writes cost this thread
        return Importance("ped-anova", 9, len(results), {"score": {"x": 1.0}})

    live = Live(compute, lambda found, step: published.append(step), interval=10, clock=clock, count=len, cpu=cpu)
    clock.now = 10
    live.offer(lambda: ["r"])
    live.close()
    assert live.cost == 2.0
    wait = 2.0 / importance_report.LIVE_SHARE
    assert wait > 10
    clock.now = 10 + wait - 1
    live.offer(lambda: ["r"] * 2)
    live.close()
    assert published == [1]  # not due: 10 s passed, but the last one cost more than the share allows
    clock.now = 10 + wait
    live.offer(lambda: ["r"] * 3)
    live.close()
    assert published == [1, 3]


def test_the_importances_while_results_arrive_go_to_mlflow_only_and_the_final_ones_to_prefect_too(monkeypatch):
    """A Prefect table artifact cannot be updated: each live one was another card in the flow run's Artifacts tab."""
    import prefect.artifacts

    from prefect_hyperband.tasks import importance_report

    made = []
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda **kw: made.append(kw["key"]) or "id")
    found = Importance("ped-anova", 9, 12, {"score": {"x": 0.75, "y": 0.25}})
    assert importance_report.publish(found, None, None, 5, prefect=False)["artifact"] is None
    assert made == []
    assert importance_report.publish(found, None, None, 12)["artifact"] == "id"
    assert made == [importance_report.IMPORTANCE_KEY]
