"""The loop's MLflow tracker (``tracking.tracker``): a long close answers as it goes, and says a failure once."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from prefect_hyperband.hyperband.scheduler import TrialRecord
from prefect_hyperband.tracking import tracker as tracker_module
from prefect_hyperband.tracking.tracker import MlflowTracker
from prefect_hyperband.trainers.stopping import StopToken


class _Writer:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def submit(self, name, *args) -> Future:
        self.calls.append((name, *args))
        done: Future = Future()
        if self.fail:
            done.set_exception(ConnectionError("MLflow gone"))
        else:
            done.set_result(None)
        return done

    def shutdown(self) -> None:
        pass


def _records(ids):
    return [TrialRecord(t, 0, {}, "completed", 2, 9, {9: 0.5}, None) for t in ids]


def _tracker(writer, warned):
    job = SimpleNamespace(tracking_uri="sqlite:///mlflow.db")
    runs = {f"s0-{i:04d}": f"run-{i}" for i in range(250)}
    return MlflowTracker(job, runs, _records, StopToken(), warned.append, writer)


def test_a_thousand_runs_end_in_calls_of_a_hundred_each_with_its_own_runs():
    warned: list[str] = []
    writer = _Writer()
    tracker = _tracker(writer, warned)
    ids = [f"s0-{i:04d}" for i in range(250)] + ["s0-9999"]  # one trial whose run was never made
    tracker.close(ids)
    tracker.drain()
    sizes = [len(call[2]) for call in writer.calls]
    assert sizes == [tracker_module.CLOSE_CHUNK, tracker_module.CLOSE_CHUNK, 51]
    assert all(set(call[3]) <= {r.trial_id for r in call[2]} for call in writer.calls)  # each call its own runs
    assert sum(len(call[3]) for call in writer.calls) == 250 and not warned


def test_a_close_that_fails_in_every_call_is_said_once():
    warned: list[str] = []
    tracker = _tracker(_Writer(fail=True), warned)
    tracker.close([f"s0-{i:04d}" for i in range(250)])
    tracker.drain()
    assert len(warned) == 1 and warned[0].startswith("MLflow: closing trial runs failed after retries: ConnectionError")


def test_each_rungs_write_carries_the_trials_best_so_far_in_the_metrics_direction_a_resumes_from_its_state():
    """A trial run's ``best_<metric>`` (``records.log_trial_rung``): the best over the rungs written, ties to the smaller
    resource, a NaN or a failure never best; a resumed job's trials start from their saved best."""
    from prefect_hyperband.executors.result import Outcome
    from prefect_hyperband.hyperband.scheduler import trial_bests
    from prefect_hyperband.hyperband.trial import TrialRung
    from prefect_hyperband.trainers.base import Evaluation

    writer = _Writer()
    job = SimpleNamespace(tracking_uri="sqlite:///mlflow.db", direction="min")
    saved = [TrialRecord("s0-0001", 0, {}, "promoted", 1, 1, {1: 0.2}, None)]
    tracker = MlflowTracker(job, {}, _records, StopToken(), [].append, writer, trial_bests(saved, "min"))

    def best(trial_id: str, rung: int, resource: int, score: float | None, error: str | None = None):
        trial_rung = TrialRung(trial_id, 0, rung, resource, {}, None)
        tracker.record(Outcome(trial_rung, None, None if score is None else Evaluation(score, 0.0), error)).result()
        return writer.calls[-1][-1]

    assert best("s0-0000", 0, 1, 0.5) == (1, 0.5)
    assert best("s0-0000", 1, 3, 0.3) == (3, 0.3)
    assert best("s0-0000", 2, 9, 0.4) == (3, 0.3)  # worse: the best so far again, at this rung's step
    assert best("s0-0000", 3, 27, 0.3) == (3, 0.3)  # a tie keeps the smaller resource
    assert best("s0-0000", 4, 81, float("nan")) == (3, 0.3)
    assert best("s0-0000", 4, 81, None, "ValueError: boom") == (3, 0.3)
    assert best("s0-0001", 1, 3, 0.25) == (1, 0.2)  # resumed: its saved rung's
    assert best("s0-0002", 0, 1, None, "ValueError: boom") is None
