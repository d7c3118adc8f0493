"""Which writer a job gets (``tasks.writer.writer_for``): a process only where results can come tens a second."""

from __future__ import annotations

import pytest

from prefect_hyperband.tasks.writer import ThreadWriter, make_writer, writer_for


@pytest.mark.parametrize("concurrency, mode, max_trials, budget, kind", [
    (2, "hyperband", None, None, "thread"),
    (4, "asha", 300, None, "thread"),
    (16, "hyperband", None, None, "process"),
    (4, "asha", 500, None, "process"),
    (4, "asha", None, 600.0, "process"),
    (4, "hyperband", 5000, None, "thread"),  # max_trials is ASHA's
])
def test_a_process_writes_where_results_come_fast(monkeypatch, concurrency, mode, max_trials, budget, kind):
    monkeypatch.delenv("HYPERBAND_MLFLOW_WRITER", raising=False)
    assert writer_for(concurrency, mode, max_trials, budget) == kind


@pytest.mark.parametrize("forced", ["process", "thread"])
def test_the_environment_decides_for_every_job(monkeypatch, forced):
    monkeypatch.setenv("HYPERBAND_MLFLOW_WRITER", forced)
    assert writer_for(2, "hyperband", None, None) == forced
    assert writer_for(256, "asha", 10_000, None) == forced


def test_a_thread_writer_answers_in_order():
    writer = make_writer("thread")
    assert isinstance(writer, ThreadWriter)
    assert writer.submit("ping").result(timeout=10) == __import__("os").getpid()  # this process: no child
    writer.shutdown()
