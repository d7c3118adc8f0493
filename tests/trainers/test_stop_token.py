"""The job's stop token: a training that sleeps wakes at once on a stop or on its trial-rung given up."""

from __future__ import annotations

import threading
import time

import pytest

from prefect_hyperband.trainers import stopping


def _sleeper(token: stopping.StopToken, seconds: float, out: dict) -> threading.Thread:
    def run() -> None:
        out["ident"] = threading.get_ident()
        with stopping.bind(token):
            began = time.monotonic()
            try:
                stopping.sleep(seconds)
                out["ended"] = "slept"
            except stopping.Stopped as exc:
                out["ended"] = str(exc)
            out["took"] = time.monotonic() - began

    thread = threading.Thread(target=run)
    thread.start()
    while "ident" not in out:
        time.sleep(0.001)
    return thread


def test_a_sleep_ends_at_once_when_the_job_stops():
    token, out = stopping.StopToken(), {}
    thread = _sleeper(token, 60.0, out)
    token.request(reason="a goal was met")
    thread.join(5)
    assert out["ended"] == "the job is stopping" and out["took"] < 5


def test_a_sleep_ends_when_its_own_trial_rung_is_given_up_and_the_others_sleep_on():
    token, given_up, other = stopping.StopToken(), {}, {}
    a, b = _sleeper(token, 60.0, given_up), _sleeper(token, 0.3, other)
    token.cancel_thread(given_up["ident"])
    a.join(5)
    assert given_up["ended"] == "the trial-rung was given up"
    b.join(5)
    assert other["ended"] == "slept" and other["took"] == pytest.approx(0.3, abs=0.25)


def test_a_sleep_without_a_stop_sleeps_its_time():
    out = {}
    _sleeper(stopping.StopToken(), 0.05, out).join(5)
    assert out["ended"] == "slept" and out["took"] >= 0.05
