"""Two jobs in one process (threads), with equal settings: each has its own trainers and its own stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from prefect_hyperband.executors.state import saved_rows
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.trainers import factory, stopping

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_two_jobs_side_by_side_finish_apart_and_a_stop_of_one_leaves_the_other_running(tracking_uri, tmp_path,
                                                                                     monkeypatch):
    from prefect_hyperband.flows.tune import tune

    built: list[tuple[str, object]] = []
    real_build = factory.build

    def counted(settings):  # which job built which trainer
        trainer = real_build(settings)
        built.append((threading.current_thread().name, trainer))
        return trainer

    monkeypatch.setattr(factory, "build", counted)
    tokens = {"a": stopping.StopToken(), "b": stopping.StopToken()}
    states: dict[str, object] = {}

    def job(name: str) -> None:
        params = TuneParams(model="synthetic", max_resource=9, eta=3, seed=1, concurrency=1, unit_seconds=0.02,
                            job_dir=str(tmp_path), job_id=f"job-{name}", experiment="two", baseline=False)
        with stopping.bind(tokens[name]):
            states[name] = tune(params, return_state=True)

    threads = {n: threading.Thread(target=job, args=(n,), name=f"job-{n}") for n in tokens}
    for t in threads.values():
        t.start()
    state_a = Path(tmp_path) / "job-a" / "state.json"
    deadline = time.monotonic() + 120
    while not (state_a.exists() and saved_rows(state_a.parent)) and time.monotonic() < deadline:  # a has results
        time.sleep(0.05)
    tokens["a"].request()
    for t in threads.values():
        t.join(timeout=300)
    assert states["a"].is_cancelled(), states["a"]
    b = states["b"].result()
    assert b["summary"]["trial_rungs"] == 22 and b["summary"]["configs"] == 17  # b ran to its end
    assert not tokens["b"].requested()
    trainers = {name: {id(t) for n, t in built if n == name} for name in ("job-a", "job-b")}
    assert all(trainers.values()) and not trainers["job-a"] & trainers["job-b"]  # one trainer per job, not shared
