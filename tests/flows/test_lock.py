"""The job lock: one process per job, kept fresh while it runs, taken over from a holder that is gone."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.flows import lock


def _write(job_dir, host: str, pid: int, age: float = 0.0, **about) -> None:
    path = lock.lock_path(job_dir)
    path.write_text(json.dumps({"host": host, "pid": pid, **about}))
    then = time.time() - age
    os.utime(path, (then, then))


def test_another_hosts_fresh_lock_refuses_the_job_naming_the_host_and_its_age(tmp_path):
    _write(tmp_path, "controller-2", 4242, age=30)
    with pytest.raises(InputError) as err:
        lock.check_free(tmp_path, "j1")
    assert "host controller-2, pid 4242, its lock refreshed 30 s ago" in str(err.value)
    with pytest.raises(InputError):
        with lock.job_lock(tmp_path, "j1"):
            pass
    assert json.loads(lock.lock_path(tmp_path).read_text())["host"] == "controller-2"  # left to its holder


def test_another_hosts_lock_not_refreshed_is_taken_over_and_named(tmp_path):
    _write(tmp_path, "controller-2", 4242, age=lock.STALE_AFTER + 60, flow_run_id="f-old")
    with lock.job_lock(tmp_path, "j1", flow_run_id="f-new") as stale:
        held = json.loads(lock.lock_path(tmp_path).read_text())
        assert held["host"] == socket.gethostname() and held["pid"] == os.getpid() and held["flow_run_id"] == "f-new"
    assert stale["flow_run_id"] == "f-old" and stale["silent"] >= lock.STALE_AFTER
    line = lock.took_over(stale)
    assert "from host controller-2 (pid 4242)" in line and "not refreshed for 2" in line
    assert not lock.lock_path(tmp_path).exists()


def test_this_hosts_dead_process_is_taken_over_without_the_other_host_line(tmp_path):
    _write(tmp_path, socket.gethostname(), 2 ** 22 + 12345)  # no such pid (pid_max is 2**22 at most)
    with lock.job_lock(tmp_path, "j1") as stale:
        assert stale["pid"] == 2 ** 22 + 12345
    assert lock.took_over(stale) is None and lock.took_over(None) is None


class _Beats:
    """A stop event whose first ``n`` waits time out (a beat each), then is set."""

    def __init__(self, n: int) -> None:
        self.n, self.waited = n, []

    def wait(self, timeout: float) -> bool:
        self.waited.append(timeout)
        self.n -= 1
        return self.n < 0


def test_a_held_lock_is_refreshed_at_each_beat(tmp_path):
    _write(tmp_path, socket.gethostname(), os.getpid(), age=1000)
    lock.keep_fresh(lock.lock_path(tmp_path), _Beats(2), every=7.0)
    assert time.time() - lock.lock_path(tmp_path).stat().st_mtime < 60


def test_a_beat_on_a_vanished_lock_does_not_raise(tmp_path):
    beats = _Beats(2)
    lock.keep_fresh(tmp_path / "gone" / "lock", beats, every=7.0)
    assert beats.waited == [7.0, 7.0, 7.0]


def test_the_heartbeat_thread_ends_with_the_lock(tmp_path):
    with lock.job_lock(tmp_path, "j1"):
        assert any(t.name == "hyperband-lock" for t in threading.enumerate())
    assert not any(t.name == "hyperband-lock" for t in threading.enumerate())
