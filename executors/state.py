"""Job state on disk: JSON files in the job directory, written atomically, read back by ``--resume``. The engine's
(no Prefect): what it has to say of a damaged file goes to the ``say`` it is given (``flows.say.in_run``: the flow
run's log)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_hyperband.common.errors import InputError, full_disk, no_space, on_stderr
from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.storage import PREVIOUS, Storage, is_local, join
from prefect_hyperband.hyperband.journal import Diverged, Journal, replay

if TYPE_CHECKING:  # (an annotation only)
    from prefect_hyperband.hyperband.scheduler import Scheduler


def job_store(job_dir: str | Path, job_id: str, storage: str | None = None) -> Storage:
    """The job's record, state and checkpoints: in ``job_dir``, or under ``<storage>/<job_id>`` when that is a URL."""
    remote = join(storage, job_id) if storage and not is_local(storage) else None
    return Storage(remote or str(job_dir), str(job_dir))


def save_job_record(job: Job, params: dict[str, Any], facts: dict[str, Any] | None = None) -> None:
    """``job.json``, and the same record as its previous version: a resume reads either. ``facts``: what a later
    job's ``--warm-start`` compares (``flows.parents.facts``); ``warm``: the job's own warm start, kept for its resume;
    ``tracking_uri``: its MLflow store (``prepare`` made a local one's path absolute: a resume from another folder
    finds it)."""
    record = {"job_id": job.job_id, "params": params, "parent_run_id": job.parent_run_id, "facts": facts,
              "warm": job.warm, "tracking_uri": job.tracking_uri}
    store = job.store()
    store.write_json("job.json" + PREVIOUS, record)
    store.write_json("job.json", record)


def _job_record(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("params"), dict) or not value.get("job_id"):
        raise ValueError("not a job record (job_id and params expected)")
    return value


def load_job_record(store: Storage, say: Callable[[str], None] = on_stderr) -> dict[str, Any] | None:
    """The job's record, from its previous version when ``job.json`` is damaged (said in one line, ``say``); None
    when the job has none; ``InputError`` naming the file when neither is good."""
    record, notice = store.read_kept("job.json", _job_record)
    if notice:
        say(notice)
    return record


#: the snapshot: the scheduler, the rows, the runs, and the generation of the journal that follows it
SNAPSHOT = "state.json"
#: a journal's records take at least this many bytes before a snapshot folds them in (then: as many as the
#: snapshot itself, so the bytes written per result stay flat however large the job grows)
COMPACT_MIN_BYTES = 256 * 1024
#: on an object store (no append), the journal's records go up as one object per batch, at most this often
OBJECT_BATCH_SECONDS = 1.0


def journal_key(store: Storage, generation: int) -> str:
    """Generation ``generation``'s journal: one file appended to on a folder, a folder of objects on a store."""
    return f"journal.{generation:06d}.jsonl" if store.local else f"journal.{generation:06d}"


def _generation(key: str) -> int:
    return int(key.split(".")[1])


class StateWriter:
    """The job's state on its storage, as a snapshot (``state.json``, written atomically, its previous version
    kept) and a journal of what happened since: after each pass of the loop that settled results, one record
    (the scheduler's calls, ``hyperband.journal``; the new rows and runs; the seconds spent) is appended, and a
    snapshot folds the journal in once it has grown as large as the snapshot. ``--resume`` loads the snapshot and
    replays the journal (``load_state``). A result thus costs one appended record, not a rewrite of the job."""

    def __init__(self, job: Job, scheduler: Scheduler, runs: dict[str, str], generation: int = 0, rows_saved: int = 0,
                 written: dict[str, int] | None = None, clock: Callable[[], float] = time.monotonic,
                 runs_lock: threading.Lock | None = None, on_full: Callable[[str], None] | None = None,
                 journal: Journal | None = None) -> None:
        self.store, self.scheduler, self.runs, self.clock = job.store(), scheduler, runs, clock
        self.journal = journal or Journal()  # the scheduler's calls since the last record, written by the loop
        # a full disk: the writer stops (what it took from the scheduler is in no record: nothing may follow it) and
        # ``on_full`` stops the job; the resume replays the journal up to the last whole record
        self.on_full, self.full = on_full, None
        # ``runs`` grows on the MLflow writer's thread as child runs are made (``tracking.tracker``): read under its lock
        self.runs_lock = runs_lock or threading.Lock()
        self.generation = generation  # the newest journal on the storage (0: none); ``start`` snapshots past it
        self.rows_saved, self.runs_saved = rows_saved, len(runs)
        self.snapshot_bytes, self.journal_bytes, self.seq = 0, 0, 0
        self.pending: list[bytes] = []  # an object store's records not yet sent
        self.sent = clock()
        self.written = dict(written or {"bytes": 0, "records": 0, "snapshots": 0})

    def start(self, rows: list[dict[str, Any]], elapsed: float, lost: float) -> None:
        """Before the job's first call: a snapshot of where it starts (a resume: the state it loaded, its journal
        replayed), so that the previous snapshot and the journals after it always lead to the newest one."""
        self._unless_full(self.snapshot, rows, elapsed, lost)

    def save(self, rows: list[dict[str, Any]], elapsed: float, lost: float, final: bool = False) -> None:
        """What the loop settled since the last save as one journal record; then, at the end (``final``) or once
        the journal has grown as large as the snapshot, a new snapshot that folds it in."""
        if self.generation == 0:
            self.start(rows, elapsed, lost)
            return
        self._unless_full(self._save, rows, elapsed, lost, final)

    def _save(self, rows: list[dict[str, Any]], elapsed: float, lost: float, final: bool) -> None:
        self._record(rows, elapsed, lost)
        if final or self.journal_bytes >= max(self.snapshot_bytes, COMPACT_MIN_BYTES):
            self.snapshot(rows, elapsed, lost)

    def _unless_full(self, write: Callable[..., None], *args: Any) -> None:
        """``write``, unless the disk filled: then no write follows (said once, through ``on_full``)."""
        if self.full is not None:
            return
        try:
            write(*args)
        except OSError as exc:
            if not no_space(exc) or self.on_full is None:
                raise
            self.full = full_disk(getattr(exc, "filename", None) or self.store.root)
            self.on_full(self.full)

    def _record(self, rows: list[dict[str, Any]], elapsed: float, lost: float) -> None:
        new_runs = list(self._runs().items())[self.runs_saved:]  # insertion order: the new ones are last
        calls = self.journal.take()
        if not calls and len(rows) == self.rows_saved and not new_runs:
            return
        record = {"calls": calls, "rows": rows[self.rows_saved:], "runs": dict(new_runs), "elapsed": elapsed,
                  "lost": lost}
        self.rows_saved, self.runs_saved = len(rows), self.runs_saved + len(new_runs)
        data = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        self.journal_bytes += len(data)
        if self.store.local:
            self.store.append(journal_key(self.store, self.generation), data)
            self._count(len(data), 1)
        else:
            self.pending.append(data)
            if self.clock() - self.sent >= OBJECT_BATCH_SECONDS:
                self._send()

    def _runs(self) -> dict[str, str]:
        with self.runs_lock:
            return dict(self.runs)

    def _send(self) -> None:
        if self.pending and self.generation:
            data, self.pending = b"".join(self.pending), []
            self.seq += 1
            self.store.write_bytes(f"{journal_key(self.store, self.generation)}/{self.seq:09d}.jsonl", data)
            self._count(len(data), 1)
        self.sent = self.clock()

    def snapshot(self, rows: list[dict[str, Any]], elapsed: float, lost: float) -> None:
        """Everything in one new ``state.json``, followed by an empty journal of the next generation; journals
        older than the previous snapshot's are deleted."""
        self._send()  # the journal complete up to this snapshot: the previous one and it lead here
        if self.journal.take() and self.generation:
            raise RuntimeError("a snapshot with calls not journaled: save() records them first")
        self.generation += 1
        self.written["snapshots"] += 1
        state = {"scheduler": self.scheduler.to_json(), "rows": rows, "elapsed": elapsed, "lost": lost,
                 "runs": self._runs(), "journal": self.generation, "writes": self.written}
        data = json.dumps(state, separators=(",", ":"), default=str).encode()
        first = self.generation == 1
        self.store.write_bytes(SNAPSHOT, data, keep_previous=not first)
        if first:  # a new job's first snapshot is its previous version too: a damaged one has a good twin
            self.store.write_bytes(SNAPSHOT + PREVIOUS, data)
        self._count(len(data) * (1 + first), 0)
        self.snapshot_bytes, self.journal_bytes, self.seq = len(data), 0, 0
        self.rows_saved, self.runs_saved = len(rows), len(state["runs"])
        for key in self.store.keys("journal."):
            if _generation(key) < self.generation - 1:
                (self.store.delete if self.store.local else self.store.delete_folder)(key)

    def _count(self, n: int, records: int) -> None:
        self.written["bytes"] += n
        self.written["records"] += records


def read_journal(store: Storage, generation: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's records from ``generation`` on, in order, and the notices (one line each) of what was left
    out: a torn last record (a kill mid-append) is skipped; a damaged record ends the journal there."""
    records: list[dict[str, Any]] = []
    notices: list[str] = []
    keys = sorted({k for k in store.keys("journal.") if _generation(k) >= generation}, key=_generation)
    for key in keys:
        pieces = [key] if store.local else store.keys(f"{key}/")
        for piece in pieces:
            data = store.read_bytes(piece) or b""
            lines = data.split(b"\n")
            for i, line in enumerate(lines):
                if not line:
                    continue
                last = i == len(lines) - 1  # no newline after it: cut short
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict) or not isinstance(record.get("calls"), list):
                        raise ValueError("not a journal record")
                except ValueError as exc:
                    where = store.url(piece)
                    if last:
                        notices.append(f"{where}: its last record is torn (a kill mid-append), skipped; the results "
                                       "it held are trained again")
                        break
                    notices.append(f"{where}: record {i + 1} is damaged ({type(exc).__name__}); the journal is read "
                                   "up to it, the results after it are trained again")
                    return records, notices
                if last:
                    notices.append(f"{store.url(piece)}: its last record is torn (a kill mid-append), skipped; the "
                                   "results it held are trained again")
                    break
                records.append(record)
    return records, notices


def load_state(job: Job, build: Callable[[dict[str, Any]], Any],
               say: Callable[[str], None] = on_stderr) -> tuple[dict[str, Any], Any] | None:
    """The saved state and its scheduler (``build`` of the snapshot's, with its trial-rungs in flight still out), the
    journal replayed on it, then its trial-rungs in flight offered again; from the snapshot's previous version when
    ``state.json`` is damaged or ``build`` rejects it (said in one line). None for a new job; ``InputError``
    naming the file when neither version is good. The state returned carries ``journal``: the generation the
    job's next records go after (the first save snapshots, so a torn journal is never appended to)."""
    store = job.store()

    def check(saved: Any) -> tuple[dict[str, Any], Any]:
        rows, elapsed, lost = saved["rows"], float(saved["elapsed"]), float(saved.get("lost", 0.0))
        if not isinstance(rows, list) or elapsed < 0 or lost < 0 or not isinstance(saved.get("runs", {}), dict):
            raise ValueError("rows, elapsed, lost or runs out of shape")
        return saved, build(saved["scheduler"])

    found, notice = store.read_kept(SNAPSHOT, check)
    if notice:
        say(notice)
    if found is None:
        return None
    saved, scheduler = found
    saved = {**saved, "rows": list(saved["rows"]), "runs": dict(saved.get("runs") or {})}
    generation = saved.get("journal")
    if generation:
        records, notices = read_journal(store, int(generation))
        applied = _replay(scheduler, records, notices)
        if applied < len(records):  # a record half made: the snapshot again, and the records before it
            scheduler = build(found[0]["scheduler"])
            _replay(scheduler, records[:applied], [])
        for record in records[:applied]:
            saved["rows"] += record["rows"]
            saved["runs"].update(record["runs"])
            saved["elapsed"], saved["lost"] = record["elapsed"], record["lost"]
        for line in notices:
            say(line)
        saved["journal"] = max([int(generation), *(_generation(k) for k in store.keys("journal."))])
    scheduler.requeue()
    return saved, scheduler


def _replay(scheduler: Any, records: list[dict[str, Any]], notices: list[str]) -> int:
    """The records made again on ``scheduler``, up to the first that does not apply (its notice added)."""
    for i, record in enumerate(records):
        try:
            replay(scheduler, record["calls"])
        except Diverged as exc:
            notices.append(f"the journal's record {i + 1} does not follow from the snapshot ({exc}); the results "
                           "from there on are trained again")
            return i
    return len(records)


def saved_rows(where: str | Path) -> list[dict[str, Any]]:
    """The trial-rungs a job has saved so far (its snapshot's and its journal's) in its folder or at its storage
    URL (``<storage>/<job id>``), read without building its scheduler: what a watcher (a test, a dashboard)
    counts."""
    store = Storage(str(where), str(where))
    saved = store.read_json(SNAPSHOT)
    if saved is None:
        return []
    rows = list(saved["rows"])
    if saved.get("journal"):
        for record in read_journal(store, int(saved["journal"]))[0]:
            rows += record["rows"]
    return rows


def check_resumable(store: Storage, job_id: str) -> None:
    """A job to resume has its snapshot (or its previous version) once it has begun its loop (a journal, a
    checkpoint): without one, nothing says what the journal follows from, and starting over would train every trial
    again beside the child runs it logged. A job with none of these had not begun and starts from the beginning."""
    if set(store.keys(SNAPSHOT)) & {SNAPSHOT, SNAPSHOT + PREVIOUS}:
        return
    begun = store.keys("journal.") or (any(Path(store.url("checkpoints")).glob("*")) if store.local
                                       else store.keys("checkpoints/"))
    if begun:
        raise InputError(f"job {job_id!r}: {store.url(SNAPSHOT)} and its previous version are gone, but its journal "
                         "or checkpoints are there; restore either file to resume, or start a new job")

