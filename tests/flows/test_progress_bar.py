"""The job's progress artifact: moved by a thread of its own, so the job's loop never waits for the Prefect API."""

from __future__ import annotations

import threading

import pytest

from prefect_hyperband.flows import progress_bar
from prefect_hyperband.tasks import report


def test_the_bar_moves_without_its_caller_waiting_for_the_api_and_never_back(monkeypatch):
    """The Prefect API slow to answer (a busy server): ``advance`` returns at once, the counts that came meanwhile go
    as one update of the latest, in order; ``finish`` waits for the update in flight, then shows 100%."""
    sent, gate = [], threading.Event()

    def update(artifact_id, done, total):
        gate.wait(30)
        sent.append((done, total))

    monkeypatch.setattr(report, "update_progress", update)
    bar = progress_bar.ProgressBar("a-uuid", 10)
    assert bar.advance() == pytest.approx(10.0)  # its update now waits on the API
    assert [bar.advance(2), bar.advance()] == pytest.approx([30.0, 40.0])
    assert not bar.flush(timeout=0.2) and sent == []
    gate.set()
    assert bar.flush(timeout=30)
    assert sent in ([(1, 10), (4, 10)], [(4, 10)])  # the latest count, never an older one after it
    bar.advance(20)  # more than planned (ASHA): the total grows with it
    bar.finish()
    assert sent[-1] == (24, 24) and sent == sorted(sent)
