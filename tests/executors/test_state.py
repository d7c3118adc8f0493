"""The job's state as a snapshot and a journal (``executors.state``): a result costs one appended record, a kill at
any point resumes to the state of the last record, a torn last record is skipped in one line, a damaged snapshot
falls back on its previous version and both journals; the same on an object store, in segments."""

from __future__ import annotations

import json
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from prefect_hyperband.executors import state as state_mod
from prefect_hyperband.executors.state import StateWriter, journal_key, load_state, saved_rows
from prefect_hyperband.executors.storage import Storage
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.journal import Journal
from prefect_hyperband.hyperband.sampler import RandomSampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler
from prefect_hyperband.hyperband.space import parse

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def new_scheduler():
    return AshaScheduler(AshaState.create(1, 27, 3, "min"), RandomSampler(SPACE, 3), max_trials=400)


def build(raw):
    """As ``executors.schedulers.make_scheduler``: as saved, its trial-rungs in flight still out."""
    return AshaScheduler(AshaState.from_json(raw["state"]), RandomSampler.from_json(SPACE, raw["sampler"]),
                         raw["max_trials"], raw["time_budget"], requeued=False)


class Job:
    """A job of ``n`` results at ``width`` in flight, saved the way the loop saves (``save`` after each pass)."""

    def __init__(self, store: Storage, width: int = 4, clock=lambda: 0.0) -> None:
        self.store_, self.scheduler, self.journal = store, new_scheduler(), Journal()
        self.rows, self.runs, self.flying, self.rng = [], {}, [], np.random.default_rng(0)
        self.writer = StateWriter(SimpleNamespace(store=lambda: store), self.scheduler, self.runs, clock=clock,
                                  journal=self.journal)
        self.width = width
        self.writer.start(self.rows, 0.0, 0.0)

    def store(self) -> Storage:
        return self.store_

    def passes(self, n: int) -> None:
        for _ in range(n):
            while len(self.flying) < self.width and (job := self.scheduler.next_trial_rung()) is not None:
                self.flying.append(job)
                self.journal.handed(job)
                self.runs.setdefault(job.trial_id, f"run-{job.trial_id}")
            for _ in range(int(self.rng.integers(1, 3))):  # one or two results a pass, as they arrive
                if not self.flying:
                    break
                job = self.flying.pop(int(self.rng.integers(len(self.flying))))
                h = zlib.crc32(f"{job.trial_id}@{job.resource}".encode())
                self.scheduler.report(job.trial_id, job.resource, (h % 1000) / 1000, f"ck/{job.trial_id}", None)
                self.journal.reported(job.trial_id, job.resource, (h % 1000) / 1000, f"ck/{job.trial_id}", None)
                self.rows.append({"trial_id": job.trial_id, "resource": job.resource, "score": (h % 1000) / 1000})
            self.writer.save(self.rows, float(len(self.rows)), 0.0)

    def expected(self):
        """The state a resume must find: this scheduler, its trial-rungs in flight offered again."""
        raw = json.loads(json.dumps(self.scheduler.to_json()))
        again = build(raw)
        again.requeue()
        return again


def loaded(store: Storage, said: list[str], monkeypatch):
    return load_state(SimpleNamespace(store=lambda: store), build, said.append)


def same(a, b) -> None:
    assert a.to_json() == b.to_json() and a.backlog == b.backlog


def test_a_result_is_one_appended_record_and_a_resume_replays_them(tmp_path, monkeypatch):
    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    job.passes(60)
    snapshot = json.loads((tmp_path / "state.json").read_text())
    assert snapshot["rows"] == []  # where the job started: a snapshot is not rewritten per result
    lines = (tmp_path / journal_key(store, snapshot["journal"])).read_text().splitlines()
    assert len(lines) == 60  # one record a pass
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    assert said == []
    same(scheduler, job.expected())
    assert saved["rows"] == job.rows and saved["runs"] == job.runs and saved["elapsed"] == len(job.rows)
    assert saved_rows(tmp_path) == job.rows


def test_a_torn_last_record_is_skipped_in_one_line(tmp_path, monkeypatch):
    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    job.passes(30)
    before = job.expected()
    rows = list(job.rows)
    journal = tmp_path / journal_key(store, 1)
    whole = journal.read_bytes()
    job.passes(1)
    journal.write_bytes(journal.read_bytes()[: len(whole) + 25])  # killed mid-append
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    assert len(said) == 1 and "its last record is torn" in said[0] and said[0].count("\n") == 0
    same(scheduler, before)
    assert saved["rows"] == rows
    assert saved["journal"] == 1  # the next run snapshots as generation 2: the torn file is never appended to


def test_a_resumed_job_snapshots_first_and_keeps_on_where_it_was(tmp_path, monkeypatch):
    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    job.passes(20)
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    writer = StateWriter(SimpleNamespace(store=lambda: store), scheduler, dict(saved["runs"]), saved["journal"],
                         len(saved["rows"]), saved.get("writes"))
    writer.start(saved["rows"], saved["elapsed"], 0.0)
    assert json.loads((tmp_path / "state.json").read_text())["journal"] == 2
    assert len(json.loads((tmp_path / "state.json").read_text())["rows"]) == len(job.rows)


def test_compaction_keeps_bytes_per_result_flat_and_deletes_what_no_version_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "COMPACT_MIN_BYTES", 2_000)
    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    job.passes(150)
    first = job.writer.written["bytes"] / len(job.rows)
    job.passes(1500)
    assert job.writer.generation > 3
    per_result = job.writer.written["bytes"] / len(job.rows)
    assert per_result < 4 * first  # a rewrite per result would grow with the job (here ~10x)
    journals = sorted(p.name for p in tmp_path.glob("journal.*"))
    assert journals == [journal_key(store, job.writer.generation - 1), journal_key(store, job.writer.generation)][
        -len(journals):] and len(journals) <= 2
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    same(scheduler, job.expected())
    assert saved["rows"] == job.rows


def test_a_damaged_snapshot_falls_back_on_its_previous_version_and_both_journals(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "COMPACT_MIN_BYTES", 2_000)
    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    job.passes(300)
    assert job.writer.generation >= 3
    path = tmp_path / "state.json"
    path.write_bytes(path.read_bytes()[:100])
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    assert len(said) == 1 and "state.json is damaged" in said[0]
    same(scheduler, job.expected())
    assert saved["rows"] == job.rows


def test_on_an_object_store_the_journal_goes_up_in_segments(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "COMPACT_MIN_BYTES", 4_000)
    now = {"t": 0.0}
    store = Storage("s3://bucket/journal-test/j1", str(tmp_path))
    job = Job(store, clock=lambda: now["t"])
    for _ in range(40):
        job.passes(5)
        now["t"] += 1.0  # a batch a second
    assert 1 <= len(job.writer.pending) <= 5  # the passes of the last second: one object for all of them
    segments = [k for k in s3.find("bucket/journal-test/j1/") if "/journal." in k]
    assert 0 < len(segments) <= 40
    job.writer._send()  # what a pass a second later would send
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    assert said == []
    same(scheduler, job.expected())
    assert saved["rows"] == job.rows


def test_a_save_reads_the_runs_under_the_lock_the_mlflow_writer_adds_them_under(tmp_path):
    """A child run's id arrives on the writer's thread while the loop saves (a 10,000-trial-rung job died on
    "dictionary changed size during iteration" in the journal's record of new runs): the save waits for the lock."""
    import threading

    job = Job(Storage(str(tmp_path), str(tmp_path)))
    job.passes(3)
    lock = job.writer.runs_lock
    done = threading.Event()
    with lock:  # the writer thread, adding a run
        saver = threading.Thread(target=lambda: (job.passes(1), done.set()))
        saver.start()
        assert not done.wait(0.3), "the save read the runs without the writer's lock"
        job.runs["late"] = "run-late"
    saver.join(10)
    assert done.is_set()
    saved = json.loads(json.dumps(job.writer._runs()))
    assert saved["late"] == "run-late"


def test_a_full_disk_mid_append_leaves_no_part_of_the_record_and_stops_the_writer(tmp_path, monkeypatch):
    """ENOSPC part-way through a journal record: the file is cut back to its last whole record, the job is told
    once (``on_full``), no record follows (the calls it took are in none), and a resume finds the state before."""
    import errno
    import os

    store = Storage(str(tmp_path), str(tmp_path))
    job = Job(store)
    full: list[str] = []
    job.writer.on_full = full.append
    job.passes(20)
    before, rows = job.expected(), list(job.rows)
    journal = tmp_path / journal_key(store, 1)
    whole = journal.read_bytes()
    real_write, calls = os.write, {"n": 0}

    def filling(fd, data):  # the disk takes 10 bytes, then is full
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", filling)
    job.passes(1)
    monkeypatch.setattr(os, "write", real_write)
    job.passes(3)  # the loop goes on until it stops: nothing more is written
    assert journal.read_bytes() == whole
    assert len(full) == 1 and full[0].startswith("no space left on device writing ") and "MiB free of" in full[0]
    said: list[str] = []
    saved, scheduler = loaded(store, said, monkeypatch)
    assert said == [] and saved["rows"] == rows
    same(scheduler, before)


def test_a_full_disk_during_an_atomic_write_keeps_the_old_file_and_leaves_no_part(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    store = Storage(str(tmp_path), str(tmp_path))
    store.write_bytes("state.json", b'{"old": true}')

    def full(self, data):
        Path.write_text(self, "part")  # what a filling disk leaves of the new file
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError):
        store.write_bytes("state.json", b'{"new": true}')
    monkeypatch.undo()
    assert (tmp_path / "state.json").read_bytes() == b'{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_full_disk_is_known_by_errno_and_by_the_words_libraries_raise():
    import errno
    import sqlite3

    from prefect_hyperband.common.errors import no_space

    assert no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert no_space(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as exc:
            raise RuntimeError("XGBoost: could not save the model") from exc
    except RuntimeError as chained:
        assert no_space(chained)
    assert not no_space(OSError(errno.EACCES, "Permission denied")) and not no_space(None)


def test_a_resumed_asha_job_takes_the_time_budget_it_is_resumed_with():
    """``--time-budget`` may change on resume: ASHA's saved budget does not hold the job to the old one."""
    job = SimpleNamespace(space=SPACE.to_dict(), prior_first=False, mode="asha", sampler="random", warm=None, seed=3)
    ran_out = AshaScheduler(AshaState.create(1, 27, 3, "min"), RandomSampler(SPACE, 3), 400, 1.0, lambda: 5.0)
    assert ran_out.next_trial_rung() is None  # 5 s in, a budget of 1 s: no new config
    saved = json.loads(json.dumps(ran_out.to_json()))
    from prefect_hyperband.executors.schedulers import make_scheduler

    looser = make_scheduler(job, 400, 60.0, lambda: 5.0, saved)
    assert looser.time_budget == 60.0 and looser.next_trial_rung() is not None


def test_a_new_warm_start_jobs_sampler_is_made_warm_by_what_the_job_hands_in():
    """``executors.schedulers`` reads no parent itself (``flows.parents.sampler_for`` is handed in): a new warm job
    without it is a programming error, said; with it, the cold sampler (its own seed) goes through it."""
    import dataclasses

    from prefect_hyperband.executors.schedulers import make_sampler

    @dataclasses.dataclass(frozen=True)
    class Job:  # the fields of executors.job.Job that a sampler is made from
        space: dict
        sampler: str = "random"
        warm: dict | None = None
        seed: int = 3

    job = Job(SPACE.to_dict(), warm={"parents": ["a"]})
    with pytest.raises(ValueError, match="warm="):
        make_sampler(job)
    seen = []
    made = make_sampler(job, warm=lambda j, cold: seen.append((j, cold)) or cold)
    assert seen == [(job, made)] and isinstance(made, RandomSampler)
