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
