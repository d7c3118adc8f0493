"""``--task-workers``: trial-rungs as background task runs that ``hyperband worker`` processes take, warm."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

BIN = Path(sys.executable).parent


@contextlib.contextmanager
def workers(tmp_path: Path, n: int, limit: int = 2, storage: str | None = None) -> Iterator[list[subprocess.Popen]]:
    """``n`` ``hyperband worker`` processes on the session's Prefect server, each in a folder of its own (with
    ``storage``: ``--storage``, and Prefect's local storage a folder of each one's, as on machines of their own)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings

    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    started = []
    try:
        for i in range(n):
            (tmp_path / f"machine-{i}").mkdir(parents=True)
            log = open(tmp_path / f"machine-{i}" / "worker.log", "w")
            own = {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / f"machine-{i}" / "prefect")} if storage else {}
            where = ["--storage", storage] if storage else []
            started.append(subprocess.Popen([str(BIN / "hyperband"), "worker", "--limit", str(limit), *where],
                                            env={**env, **own},
                                            cwd=tmp_path / f"machine-{i}", stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True))
        for i in range(n):  # each subscribed to the server: its first line after the start
            log = tmp_path / f"machine-{i}" / "worker.log"
            deadline = time.monotonic() + 60
            while "Subscribing to runs" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
        yield started
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


class _once_it_trains:  # noqa: N801  (a thread, named for what it waits for)
    """Sends ``sig`` to ``worker``'s process group at its first heartbeat for a trial-rung of the job at ``job_dir``
    (a trial-rung of its is training), once."""

    def __init__(self, job_dir: Path, worker: subprocess.Popen, sig: int) -> None:
        import threading

        self.signalled: list[str] = []
        self.thread = threading.Thread(target=self._watch, args=(job_dir / "heartbeats", worker, sig), daemon=True)
        self.thread.start()

    def _watch(self, beats: Path, worker: subprocess.Popen, sig: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for beat in list(beats.glob("*.json")) if beats.exists() else []:
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(beat.read_text())["pid"] == worker.pid:
                        os.killpg(worker.pid, sig)
                        self.signalled.append(beat.name)
                        return
            time.sleep(0.05)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


def _rows(result: dict) -> dict[tuple[str, int], float]:
    rows = json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]
    return {(r["trial_id"], r["resource"]): r["score"] for r in rows}


def test_two_workers_train_the_job_as_its_threads_do_and_a_killed_one_s_trial_rungs_run_again(
        tracking_uri, tmp_path, monkeypatch):
    """Synthetic trials are deterministic: the job on two workers reaches the scores the same job reaches on this
    process's threads. One worker SIGKILLed while it trains: its trial-rungs' heartbeats stop, the job runs them
    again on the other, and every trial-rung is recorded once, with the same scores."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    common = dict(model="synthetic", max_resource=9, eta=3, seed=4, baseline=False, register_model=False,
                  job_dir=str(tmp_path / "jobs"), concurrency=4)
    here = tune(TuneParams(**common, job_id="threads", unit_seconds=0.0))
    with workers(tmp_path, 2) as (first, second):
        on_workers = tune(TuneParams(**common, job_id="workers", unit_seconds=0.0, task_workers=True))
        assert _rows(on_workers) == _rows(here) and len(_rows(here)) == 22
        took = [len(re.findall(r" to r=\d+-[-0-9a-f]+' - Finished in state Completed",
                               (tmp_path / f"machine-{i}" / "worker.log").read_text())) for i in range(2)]
        assert sum(took) == 22 and min(took) > 0, took  # both workers took trial-rungs
        _in_the_jobs_flow_run("workers", 22)

    assert first.poll() is not None and second.poll() is not None
    # issue 78: workers and job sharing --storage, the default timeouts (60 s heartbeat, 120 s pickup): the killed
    # worker's trial-rungs, training or taken and waiting for a slot, run again once the server no longer lists it
    shared = str(tmp_path / "shared")
    with workers(tmp_path / "with-storage", 2, storage=shared) as (first, second):
        killer = _once_it_trains(Path(shared) / "killed", first, signal.SIGKILL)  # (the job's folder in --storage)
        killed = tune(TuneParams(**common, job_id="killed", unit_seconds=0.3, task_workers=True, storage=shared))
        killer.join(timeout=60)
    assert killer.signalled, "the first worker never trained a trial-rung of the job"
    assert _rows(killed) == _rows(here)  # each trial-rung once, the same scores
    crashed = _crashed("killed")
    assert crashed and all("left the Prefect server's task workers" in why for why in crashed), crashed
    assert not list((Path(shared) / "claims").glob("*.json"))  # each claim deleted with its result


def _crashed(job_id: str) -> list[str]:
    """The messages of the job's task runs marked Crashed (taken for dead)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterTags

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[f"job:{job_id}"])))
    return [run.state.message or "" for run in runs if run.state is not None and run.state.type.value == "CRASHED"]


def _in_the_jobs_flow_run(job_id: str, n: int) -> None:
    """The job's ``n`` task runs on workers are in its flow run's rung subflow runs, named for their trial-rungs, with
    the line of the worker that ran each (sent to the API in batches: waited for a while)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId, TaskRunFilter, TaskRunFilterTags

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[f"job:{job_id}"])))
        groups = {run.flow_run_id for run in runs}
        parents = {client.read_flow_run(group).parent_task_run_id for group in groups if group}
        assert len(runs) == n and None not in groups and None not in parents, [(r.name, r.flow_run_id) for r in runs]
        assert all(re.fullmatch(r".+ to r=\d+-[-0-9a-f]+", run.name) for run in runs), [run.name for run in runs]
        deadline, told = time.monotonic() + 30, set()
        while told != {r.id for r in runs} and time.monotonic() < deadline:
            time.sleep(1)
            said = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[r.id for r in runs])))
            told = {log.task_run_id for log in said if re.fullmatch(r"on .+, process \d+", log.message)}
    assert told == {r.id for r in runs}, f"{len(told)} of {n} task runs say which worker ran them"


OTHER_CODE = '''
from prefect import task
from prefect.task_worker import serve


@task(name="hyperband-trial-rung")
def trial_rung(job, rung, heartbeat_seconds):  # the same task's name, other code: another task key
    raise RuntimeError("never sent the job's trial-rungs")


if __name__ == "__main__":
    serve(trial_rung)
'''


def test_a_worker_of_other_code_is_named_in_one_line_and_a_worker_started_mid_job_takes_its_trial_rungs(
        tracking_uri, tmp_path, monkeypatch):
    """Only a worker of other code at first (a task key of another hash, as another version of the package has):
    the job says so in one warning line once the pickup timeout passes, and waits; a ``hyperband worker`` started
    then takes the trial-rungs and the job ends with every one recorded. The job and the worker share ``--storage``
    and nothing else (the worker's Prefect local storage is its own, as on another machine): the parameters travel
    through the shared storage."""
    import threading

    from prefect.settings import PREFECT_API_URL, get_current_settings

    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    monkeypatch.setenv("HYPERBAND_TASK_PICKUP_TIMEOUT", "3")
    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    lines: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("prefect_hyperband.flows.task_workers")
    logger.addHandler(keep)
    (tmp_path / "other.py").write_text(OTHER_CODE)
    other_log = open(tmp_path / "other.log", "w")
    other = subprocess.Popen([sys.executable, str(tmp_path / "other.py")], env=env, cwd=tmp_path, stdout=other_log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    done: dict = {}
    try:
        deadline = time.monotonic() + 60
        while "Subscribing to runs" not in (tmp_path / "other.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        job = threading.Thread(target=lambda: done.update(tune(TuneParams(
            model="synthetic", max_resource=3, eta=3, seed=4, baseline=False, register_model=False, unit_seconds=0.0,
            job_dir=str(tmp_path / "jobs"), storage=str(tmp_path / "shared"), job_id="late", task_workers=True))),
            daemon=True)
        job.start()
        deadline = time.monotonic() + 60
        while not any("serve other code" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.2)
        said = [line for line in lines if "serve other code" in line]
        assert len(said) == 1 and "1 hyperband worker(s) serve other code" in said[0], lines
        assert "start `hyperband worker` from the same version" in said[0] and not done
        with workers(tmp_path, 1, storage=str(tmp_path / "shared")) as (late,):
            from prefect.client.orchestration import get_client

            from prefect_hyperband.flows import worker_slots

            deadline, mine = time.monotonic() + 30, []
            while not mine and time.monotonic() < deadline:  # listed once its subscription reached the server (its
                with get_client(sync_client=True) as client:  # "Subscribing" line comes just before)
                    listed = worker_slots.serving(client)  # (a worker an earlier test killed may be listed still)
                mine = [w for w in listed if w.split(worker_slots.SLOTS_MARK)[0].endswith(f"-{late.pid}")]
                time.sleep(0 if mine else 0.2)
            assert [worker_slots.slots_of(w) for w in mine] == [2], listed  # its --limit, as the job counts it
            job.join(timeout=120)
    finally:
        logger.removeHandler(keep)
        os.killpg(other.pid, signal.SIGKILL)
        other.wait(timeout=30)
    assert not job.is_alive() and len(_rows(done)) == 6  # R=3, eta 3: 3 configs at r=1 and 1 promoted; 2 at r=3
    assert "Traceback" not in (tmp_path / "other.log").read_text()  # it never received the job's task runs
    # the parameters went through the shared storage (the worker's Prefect storage is its own) and the worker
    # deleted each once read: none pile up
    assert (tmp_path / "shared" / "task-parameters" / "parameters").is_dir()
    assert not list((tmp_path / "shared" / "task-parameters" / "parameters").iterdir())


def test_workers_without_the_jobs_storage_are_never_sent_its_trial_rungs_and_one_started_with_it_takes_them(
        tracking_uri, tmp_path):
    """Issue 78: two workers started without ``--storage`` and a job with ``--task-workers --storage``: no trial-rung
    reaches them (before: each failed to read its parameters, and trials failed), the job says once what to start,
    and a worker started with the job's ``--storage`` mid-job takes the trial-rungs: the job completes."""
    import threading

    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    lines: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("prefect_hyperband.flows.task_workers")
    logger.addHandler(keep)
    shared, done = str(tmp_path / "shared"), {}
    try:
        with workers(tmp_path / "without", 2) as unfit:
            job = threading.Thread(target=lambda: done.update(tune(TuneParams(
                model="synthetic", max_resource=3, eta=3, seed=4, baseline=False, register_model=False,
                unit_seconds=0.0, job_dir=str(tmp_path / "jobs"), storage=shared, job_id="stored",
                task_workers=True, concurrency=2))), daemon=True)
            job.start()
            deadline = time.monotonic() + 60
            while not any("read other storage" in line for line in lines) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3)  # (a second line would come now)
            said = [line for line in lines if "no task worker took it" in line]
            assert len(said) == 1 and "2 hyperband worker(s) read other storage" in said[0], lines
            assert f"start `hyperband worker --storage {shared}`" in said[0] and not done
            with workers(tmp_path / "with", 1, storage=shared):
                job.join(timeout=120)
            logs = [(tmp_path / "without" / f"machine-{i}" / "worker.log").read_text() for i in range(2)]
            assert all(p.poll() is None for p in unfit)
    finally:
        logger.removeHandler(keep)
    assert not job.is_alive() and len(_rows(done)) == 6 and done["summary"]["failed_trials"] == 0
    assert not any("Received task run" in log or "Failed to read parameters" in log for log in logs)
    assert "parameters from Prefect's task-scheduling storage" in logs[0]


#: the job's lines for a Prefect server away, each said once per outage
OUTAGE_LINES = {"wait": "the Prefect API does not answer", "logs": "the Prefect API did not take the job's log lines",
                "events-dropped": "the Prefect API's event stream dropped",
                "events-lost": "the Prefect API's event stream could not"}


def test_a_prefect_server_restarted_under_the_job_is_waited_for_in_one_line_and_the_job_completes(tmp_path):
    """A server of its own (the session's stays up), two workers and a CLI job on it; the server stopped once the job
    records results, and started again 20 s later. Its queue of task runs is in memory: what it had queued is gone,
    and what the workers ran while it was away failed there. The job says so in one warning line, waits, sends
    those trial-rungs again, and ends with every trial-rung recorded once, as the same job on threads records them."""
    import socket
    import urllib.request

    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    here = tune(TuneParams(model="synthetic", max_resource=9, eta=3, seed=4, baseline=False, register_model=False,
                           job_dir=str(tmp_path / "threads"), unit_seconds=0.0, concurrency=4, job_id="threads"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", HYPERBAND_NO_LIVE="1")

    def server() -> subprocess.Popen:
        started = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                   env=env, cwd=tmp_path, stdout=open(tmp_path / "server.log", "a"),
                                   stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
                return started
            time.sleep(0.5)
        raise AssertionError("the Prefect server did not start in 120 s")

    procs = [server()]
    try:
        for i in range(2):
            (tmp_path / f"m{i}").mkdir()
            procs.append(subprocess.Popen([str(BIN / "hyperband"), "worker"], env=env, cwd=tmp_path / f"m{i}",
                                          stdout=open(tmp_path / f"worker-{i}.log", "w"), stderr=subprocess.STDOUT,
                                          start_new_session=True))
        err = tmp_path / "job.err"
        job = subprocess.Popen([str(BIN / "hyperband"), "tune", "--model", "synthetic", "--max-resource", "9",
                                "--eta", "3", "--unit-seconds", "0.5", "--seed", "4", "--no-baseline",
                                "--no-register-model", "--task-workers", "--concurrency", "4", "--job-id", "away",
                                "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"],
                               env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=open(err, "w"))
        journal = tmp_path / "jobs" / "away"
        deadline = time.monotonic() + 180
        while not any(p.stat().st_size for p in journal.glob("journal.*")) and time.monotonic() < deadline:
            time.sleep(0.2)  # trial-rungs recorded: the job is under way on the workers
        os.killpg(procs[0].pid, signal.SIGTERM)
        procs[0].wait(timeout=60)
        time.sleep(20)
        procs[0] = server()
        assert job.wait(timeout=300) == 0, err.read_text()[-3000:]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    lines = err.read_text().splitlines()
    said = [line for line in lines if "WARNING" in line]
    # one line of the wait; beside it, at most once each, what the outage cost the Prefect UI: the job's log lines the
    # API could not take (tasks.prefect_internals), the events Prefect's client could not send (app.terminal): which of them a
    # run meets depends on what the job was sending when the server went (as tests/deployments/test_postgres counts)
    kinds = [kind for line in said for kind, words in OUTAGE_LINES.items() if words in line]
    assert len(kinds) == len(said) and kinds.count("wait") == 1, "\n".join(said)
    assert max(map(kinds.count, OUTAGE_LINES)) == 1, "\n".join(said)
    assert "Traceback" not in err.read_text()
    rows = json.loads((journal / "state.json").read_text())["rows"]
    assert len(rows) == len({(r["trial_id"], r["resource"]) for r in rows}) == 22
    assert {(r["trial_id"], r["resource"]): r["score"] for r in rows} == _rows(here)


def test_a_worker_stopped_with_sigterm_hands_its_trial_rungs_back_and_the_job_runs_them_again_at_once(
        tracking_uri, tmp_path, monkeypatch):
    """SIGTERM (systemd's stop, a container's) while a worker trains: it marks what it holds Crashed before it exits,
    so the job runs those trial-rungs again at once (the heartbeat timeout is 10 minutes here: the job does not wait
    for it), each recorded once with the scores of the same job on threads; the workers' logs carry no warning of
    Prefect's per log line."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    common = dict(model="synthetic", max_resource=9, eta=3, seed=4, baseline=False, register_model=False,
                  job_dir=str(tmp_path / "jobs"), concurrency=4)
    here = tune(TuneParams(**common, job_id="threads", unit_seconds=0.0))
    monkeypatch.setenv("HYPERBAND_HEARTBEAT_TIMEOUT", "600")
    shared = str(tmp_path / "shared")
    lines: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("prefect").addHandler(keep)
    try:
        with workers(tmp_path, 2, storage=shared) as (first, second):
            stopper = _once_it_trains(Path(shared) / "stopped", first, signal.SIGTERM)
            stopped = tune(TuneParams(**common, job_id="stopped", unit_seconds=0.3, task_workers=True,
                                      storage=shared))
            stopper.join(timeout=60)
            assert first.wait(timeout=30) == 0  # it stopped by itself, cleanly
    finally:
        logging.getLogger("prefect").removeHandler(keep)
    assert stopper.signalled, "the first worker never trained a trial-rung of the job"
    said = (tmp_path / "machine-0" / "worker.log").read_text()
    assert re.search(r"worker stopped; [1-9]\d* trial-rung\(s\) it ran handed back", said), said[-2000:]
    assert "Stopped" not in said, said[-3000:]  # the trainings its stop ended: no error lines, no tracebacks
    assert any("its hyperband worker stopped" in line for line in lines), lines
    assert _rows(stopped) == _rows(here)
    for i in range(2):
        assert "UserWarning" not in (tmp_path / f"machine-{i}" / "worker.log").read_text()
    # the handed-back task runs' claims and parameters deleted with the rest (before: their claims stayed)
    assert not list((Path(shared) / "claims").glob("*.json"))
    assert not list((Path(shared) / "task-parameters" / "parameters").glob("*"))


def test_a_job_and_its_workers_on_object_storage_train_every_trial_rung_and_leave_no_parameters_or_claims(
        tracking_uri, tmp_path, s3):
    """Issue 78: ``--task-workers --storage s3://...`` (before: the job failed at its first submission, Prefect
    refusing an unsaved block as a background task's result storage). The parameters travel through the bucket,
    the results come back through it, and what a finished job's trial-rungs left there (parameters, claims) is gone."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    url = "s3://bucket/shared-tw"
    with workers(tmp_path, 1, storage=url):
        done = tune(TuneParams(model="synthetic", max_resource=3, eta=3, seed=4, baseline=False,
                               register_model=False, unit_seconds=0.0, job_dir=str(tmp_path / "jobs"), storage=url,
                               job_id="on-s3", task_workers=True, concurrency=2))
    rows = json.loads(s3.cat_file("bucket/shared-tw/on-s3/state.json"))["rows"]
    assert len(rows) == 6 and done["summary"]["failed_trials"] == 0
    left = [k for k in s3.find(f"{url.removeprefix('s3://')}") if "/task-parameters/" in k or "/claims/" in k]
    assert left == [], left
