"""XGBoost's tracker lives in a process of its own per collective (trainers/xgboost/tracker.py): a tracker that aborts
(what xgboost 3.2's tracker does when a rank's worker dies mid-collective) takes neither its caller (the Dask
scheduler) nor the next collective with it."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil

from prefect_hyperband.trainers.xgboost import tracker


def _train_one_rank(args: dict) -> float:
    """A one-rank collective on ``args``' tracker: a small booster, its first prediction."""
    import xgboost as xgb
    from xgboost import collective

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 4)), rng.integers(0, 2, size=200)
    with collective.CommunicatorContext(**args, dmlc_task_id="000000"):
        booster = xgb.train({"objective": "binary:logistic", "nthread": 1}, xgb.DMatrix(X, y), num_boost_round=3)
    return float(booster.predict(xgb.DMatrix(X[:1]))[0])


def _children(pid: int, besides: set[int] = frozenset()) -> list[psutil.Process]:
    """The helper's live children (its trackers), other than ``besides`` (those of collectives before)."""
    return [p for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE and p.pid not in besides]


def _trackers() -> set[int]:
    """The trackers alive now (this process's helper may serve other tests' collectives under a LocalCluster)."""
    tracker.warm()
    return {p.pid for p in _children(tracker._helper.pid)}


def test_a_collective_runs_on_a_tracker_in_a_child_that_ends_with_it():
    before = _trackers()
    args = tracker.worker_args(1, "127.0.0.1")
    helper = tracker._helper.pid
    assert helper != os.getpid() and _children(helper, before)
    first = _train_one_rank(args)
    deadline = time.monotonic() + 10
    while _children(helper, before) and time.monotonic() < deadline:  # the collective's end ends its tracker
        time.sleep(0.1)
    assert not _children(helper, before)
    assert _train_one_rank(tracker.worker_args(1, "127.0.0.1")) == first


def test_an_aborted_tracker_leaves_its_caller_and_the_next_collective_alone():
    before = _trackers()
    tracker.worker_args(2, "127.0.0.1")  # a collective whose ranks never come
    helper = tracker._helper.pid
    (waiting,) = _children(helper, before)
    os.kill(waiting.pid, signal.SIGABRT)  # "terminate called after throwing an instance of 'dmlc::Error'"
    waiting.wait(10)
    assert tracker._helper.poll() is None and tracker._helper.pid == helper
    assert _train_one_rank(tracker.worker_args(1, "127.0.0.1")) > 0
