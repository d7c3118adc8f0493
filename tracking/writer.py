"""A job's MLflow writes for its trials, in order, in a process of their own (or a thread of this one).

Measured (py-spy ``--gil``, ASHA, 1,500 instant trial-rungs, 8 slots): the MLflow writer thread held the job
process's GIL 48 % of the time, and the GIL was busy 90 % of the wall, so the trainings' Prefect task runs and
the loop waited on MLflow's SQLAlchemy code. In a process of its own (``python -m
prefect_hyperband.tracking.writer``, started by ``ProcessWriter``) those writes run on another core. Requests go
over its stdin, sent by a thread of their own (the caller never waits for the pipe), and answers come back over a
pipe, pickled, one at a time and in order; what the process logs comes back as this process's log lines (logger
``prefect_hyperband.writer``).

A process costs its start (about 1.5 s of imports on these 2 cores, beside the job's own setup), so a job
gets one where results can arrive tens a second: 16 slots or more, or an ASHA job of 500 configs or more or
with a time budget (``writer_for``); a smaller job writes from a thread of its own process (``ThreadWriter``:
same calls, same order). ``HYPERBAND_MLFLOW_WRITER=process`` or ``=thread`` decides for every job.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, Union

from prefect_hyperband.executors.result import Outcome
from prefect_hyperband.tracking.records import close_trial_runs, log_trial_rung, start_trial_run, trial_params
from prefect_hyperband.tracking.service_wait import bound_client_waits

_HEADER = struct.Struct("!I")
#: the writer process: Ctrl-C and SIGTERM ignored from its first line, not only once its imports (about a second of
#: MLflow's) are done: a terminal's Ctrl-C during a job's start reaches the whole group, and a writer killed in
#: its imports printed a traceback into the job's lines (the job stops and ends it itself, ``main``)
_LAUNCH = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "import runpy; runpy.run_module('prefect_hyperband.tracking.writer', run_name='__main__', alter_sys=True)")


class TrialRuns:
    """What the writer does, wherever it runs: a trial's child run made, its trial-rungs logged, runs closed. It
    keeps the runs it made, so a trial-rung recorded right after its run's creation needs no round trip."""

    def __init__(self) -> None:
        self.created: dict[str, str] = {}
        self.tagged: dict[str, dict[str, str]] = {}  # trial id -> the close tags its result at R wrote

    def start(self, job: Any, trial_id: str, bracket: int, started: float) -> str:
        run_id = start_trial_run(job, trial_id, bracket, started)
        self.created[trial_id] = run_id
        return run_id

    def record(self, job: Any, trial_id: str, bracket: int, started: float, run_id: str | None,
               out: Outcome | None, config: dict[str, Any] | None = None,
               best: tuple[int, float] | None = None) -> str:
        """The trial's run (made now when its creation failed or never came), with the trial-rung's result ``out``
        logged to it when given (``config``: the trial's, given with its first rung, logged as the run's params with
        its first write; ``best``: the trial's best (resource, value) so far, its run's ``best_<metric>``)."""
        run_id = run_id or self.created.get(trial_id) or start_trial_run(job, trial_id, bracket, started)
        self.created[trial_id] = run_id
        if out is not None:
            params = trial_params(job, trial_id, bracket, config) if config is not None else None
            closing = log_trial_rung(job, run_id, out, params, best)
            if closing is not None:
                self.tagged[trial_id] = closing
        return run_id

    def close(self, job: Any, records: list, runs: dict[str, str]) -> None:
        close_trial_runs(job, records, {**self.created, **runs}, self.tagged)
        for t in records:
            self.tagged.pop(t.trial_id, None)

    def ping(self) -> int:
        """The writer's process id, once it has imported what it writes with."""
        return os.getpid()


class ThreadWriter:
    """``TrialRuns`` on one thread of this process."""

    def __init__(self) -> None:
        self.runs = TrialRuns()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")

    def submit(self, name: str, *args: Any) -> Future:
        return self.pool.submit(getattr(self.runs, name), *args)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)


class ProcessWriter:
    """``TrialRuns`` in a child process: ``submit`` sends a call, its future resolves when the answer comes."""

    def __init__(self) -> None:
        read_end, write_end = os.pipe()  # answers; stdout stays free for whatever a library prints
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(write_end)],
                                     stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_end,),
                                     env=os.environ.copy())
        os.close(write_end)
        self.answers = os.fdopen(read_end, "rb")
        self.lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.seq = 0
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # calls to send, in order; None: no more
        self.sender = threading.Thread(target=self._send_all, name="mlflow-writer-calls", daemon=True)
        self.sender.start()
        self.reader = threading.Thread(target=self._read, name="mlflow-writer-answers", daemon=True)
        self.reader.start()
        threading.Thread(target=self._relay, name="mlflow-writer-log", daemon=True).start()

    def submit(self, name: str, *args: Any) -> Future:
        """The call queued, never waited for: a thread of its own pickles it and writes it to the process, whose stdin
        (a pipe of 64 KiB) fills while it writes slower than results come (a 16-slot job's first wave: the job's loop
        blocked 240 to 430 ms in a write, every slot idle meanwhile)."""
        future: Future = Future()
        with self.lock:
            self.seq += 1
            self.pending[self.seq] = future
            self.outbox.put((self.seq, name, args))
        return future

    def _send_all(self) -> None:
        while (call := self.outbox.get()) is not None:
            try:
                _send(self.proc.stdin, call)
            except Exception as exc:  # noqa: BLE001  (gone: BrokenPipeError; an argument pickle refused: the call's)
                with self.lock:
                    future = self.pending.pop(call[0], None)
                gone = isinstance(exc, (OSError, ValueError))
                if future is not None:
                    future.set_exception(RuntimeError(f"the MLflow writer process is gone ({self._code()}): {exc}")
                                         if gone else exc)
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def _read(self) -> None:
        while True:
            answer = _receive(self.answers)
            if answer is None:
                break
            seq, ok, value = answer
            with self.lock:
                future = self.pending.pop(seq, None)
            if future is not None:
                future.set_result(value) if ok else future.set_exception(value)
        self.proc.wait()
        with self.lock:
            left, self.pending = list(self.pending.values()), {}
        for future in left:  # it died with calls unanswered: each is the orchestration's failure
            future.set_exception(RuntimeError(f"the MLflow writer process ended ({self._code()}) before answering"))

    def _relay(self) -> None:
        logger = logging.getLogger("prefect_hyperband.writer")
        for line in iter(self.proc.stderr.readline, b""):
            text = line.decode(errors="replace").rstrip()
            if text:
                logger.warning("%s", text)

    def _code(self) -> str:
        code = self.proc.poll()
        return "still running" if code is None else f"exit code {code}"

    def shutdown(self) -> None:
        """Every call sent and answered, then the process ends."""
        self.outbox.put(None)
        self.sender.join()
        self.reader.join()


Writer = Union[ThreadWriter, "ProcessWriter"]


#: slots from which a job's trials are written from a process of their own
PROCESS_SLOTS = 16
#: an ASHA job's configs from which its trials are written from a process of their own
PROCESS_CONFIGS = 500


def writer_for(concurrency: int, mode: str, max_trials: int | None, time_budget: float | None) -> str:
    """``process`` or ``thread``: ``HYPERBAND_MLFLOW_WRITER`` when set, else a process for a job whose results can
    come tens a second (many slots, a large or open-ended ASHA job)."""
    chosen = os.environ.get("HYPERBAND_MLFLOW_WRITER", "")
    if chosen in ("process", "thread"):
        return chosen
    large = concurrency >= PROCESS_SLOTS or (mode == "asha" and ((max_trials or 0) >= PROCESS_CONFIGS or bool(time_budget)))
    return "process" if large else "thread"


#: a writer process started ahead of the process's one job (``start_ahead``), until the job takes it
_ahead: list[ProcessWriter] = []


def start_ahead(kind: str, service_wait: float) -> None:
    """The CLI's job's writer process started now, before Prefect's temporary server, when the job will write from
    a process (``writer_for``): its imports (about 1.1 s of MLflow's) overlap the server's start instead of delaying
    the job's first trial-rung, which waits for its writer. The job's ``make_writer`` takes it; unused (a job that
    decided otherwise, or never began), it ends at exit. It inherits ``--service-wait``'s bound on MLflow's retries,
    as a writer started by the job does."""
    if kind != "process" or _ahead:
        return

    with bound_client_waits(service_wait):
        _ahead.append(ProcessWriter())
    atexit.register(_end_unused)


def _end_unused() -> None:
    while _ahead:
        _ahead.pop().shutdown()


def make_writer(kind: str = "process") -> Writer:
    """The job's writer: a process (the one started ahead, ``start_ahead``, else started now: it imports MLflow
    while the job sets up), or a thread."""
    if kind == "thread":
        return ThreadWriter()
    return _ahead.pop() if _ahead else ProcessWriter()


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size = _HEADER.unpack(header)[0]
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001  (an exception with unpicklable state: its text crosses)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main(answer_fd: int) -> None:
    """The writer process: calls from stdin, answers to ``answer_fd``, until stdin closes. Ctrl-C and SIGTERM, which
    a terminal or a supervisor sends to the job's whole process group, are the job's to handle: it stops, writes
    what it has, then closes stdin (a job killed outright closes it too)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="MLflow writer: %(message)s")
    for name in ("mlflow", "alembic", "prefect"):
        logging.getLogger(name).setLevel(logging.WARNING)
    answers = os.fdopen(answer_fd, "wb")
    runs = TrialRuns()
    while True:
        message = _receive(sys.stdin.buffer)
        if message is None:
            break
        seq, name, args = message
        try:
            answer = (seq, True, getattr(runs, name)(*args))
        except Exception as exc:  # noqa: BLE001  (the caller decides what a failed write means)
            answer = (seq, False, _picklable(exc))
        _send(answers, answer)
    answers.close()

    gc.freeze()  # the job waits for this process's exit: no last collection over MLflow's objects (as app.cli.run)


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main(int(sys.argv[1]))
