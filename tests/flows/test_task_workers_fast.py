"""``--task-workers`` without a server: what the job says of the workers it finds, and what it refuses."""

from __future__ import annotations

import pytest

from prefect_hyperband.executors import storage
from prefect_hyperband.flows import api_wait, task_parameters, task_workers, worker_slots


class _Client:
    def __init__(self, workers: list[dict]) -> None:
        self.workers = workers

    def request(self, method: str, path: str, json: dict):
        assert (method, path) == ("POST", "/task_workers/filter")
        return type("Response", (), {"json": lambda _: self.workers})()


def test_the_job_names_which_workers_serve_its_code_when_none_took_a_trial_rung():
    key = task_workers.trial_rung.task_key
    assert key.startswith("trial_rung-")
    ours = _Client([{"identifier": "a", "task_keys": [key]}])
    assert worker_slots.who_serves(ours, key) == "workers serve this code: 1 worker(s) serve it"
    other = _Client([{"identifier": "b", "task_keys": ["trial_rung-0badc0de"]}])
    assert "serve other code" in worker_slots.who_serves(other, key) and key in worker_slots.who_serves(other, key)
    assert "no hyperband worker is connected" in worker_slots.who_serves(_Client([]), key)
    assert worker_slots.serving(ours) == {"a": [key]}


def test_a_jobs_task_key_holds_its_storage_and_workers_reading_other_storage_are_named(tmp_path, monkeypatch):
    """Issue 78: a job with --storage sends its trial-rungs under a key of that storage; a worker started without it
    (or with another) serves another key, is never sent them, and the job says what to start."""
    key_of = task_workers.key_of
    monkeypatch.chdir(tmp_path)
    here = key_of("shared")
    assert here == key_of(str(tmp_path / "shared")) == key_of(f"file://{tmp_path}/shared")
    assert len({here, key_of(None), key_of("s3://b/x")}) == 3
    code = task_workers.trial_rung.task_key.rsplit("-", 1)[1]  # Prefect's hash of the code: the same for every storage
    assert here.startswith("trial_rung_on_") and here.endswith(f"-{code}") and key_of(None).endswith(f"-{code}")
    sent = task_workers.served("shared", name="s0-0001 to r=3", tags=["hyperband"])
    assert sent.task_key == here and sent.with_options(persist_result=True).task_key == here  # (as a TaskWorker keeps it)
    without = _Client([{"identifier": "h-1~slots=2", "task_keys": [key_of(None)]}])
    said = worker_slots.who_serves(without, here, str(tmp_path / "shared"))
    assert said.startswith("1 hyperband worker(s) read other storage") and f"--storage {tmp_path}/shared" in said
    assert "the trial-rungs wait for it" in said


def test_a_worker_missing_from_the_servers_list_at_every_look_for_3_s_is_gone_and_one_listed_never_is():
    from prefect_hyperband.flows.worker_watch import Roster

    now, listed = [0.0], [{"h-1~slots=2", "h-2"}]
    roster = Roster(read=lambda: listed[0], clock=lambda: now[0])
    for t in range(0, 100):  # 100 s of a live worker: never gone, whatever else happens
        now[0] = t * 1.0
        assert roster.gone("h-1") is None and roster.gone("h-2") is None
    listed[0] = {"h-2"}  # h-1 killed: its socket closed, the server forgot it
    said = []
    for t in range(100, 106):
        now[0] = t * 1.0
        said.append(roster.gone("h-1"))
    assert said[:3] == [None, None, None] and said[3].startswith("its worker h-1 left the Prefect server's task workers")
    listed[0] = {"h-1", "h-2"}  # missing once, then back (a reconnection): not gone
    now[0] = 107.0
    assert roster.gone("h-1") is None
    listed[0] = {"h-2"}
    now[0] = 108.0
    assert roster.gone("h-1") is None  # the clock starts again


def test_a_server_that_does_not_answer_is_no_sign_of_a_gone_worker():
    from prefect_hyperband.flows.worker_watch import Roster

    now = [0.0]

    def away():
        raise ConnectionError("refused")

    roster = Roster(read=away, clock=lambda: now[0])
    for t in range(30):
        now[0] = float(t)
        assert roster.gone("h-1") is None


def test_the_holder_of_a_task_run_is_its_claim_or_its_heartbeat(tmp_path):
    from prefect_hyperband.flows.worker_watch import Holder, Roster, claim_key

    store = storage.Storage(str(tmp_path / "jobs"), str(tmp_path / "jobs"))
    claims = storage.Storage(str(tmp_path / "shared"), str(tmp_path / "shared"))
    roster = Roster(read=lambda: {"h-9"}, clock=lambda: 0.0)
    holder = Holder(claims, store, "run-1", "heartbeats/run-1.json")
    assert holder.gone(roster) is None and holder.worker is None  # no claim, no beat: nobody known
    claims.write_json(claim_key("run-1"), {"worker": "h-3"})
    holder.at = -10.0  # (looked again a second later)
    holder.gone(roster)
    assert holder.worker == "h-3"
    beaten = Holder(None, store, "run-2", "heartbeats/run-2.json")
    store.write_json("heartbeats/run-2.json", {"beat": 1, "pid": 7, "worker": "h-7"})
    beaten.gone(roster)
    assert beaten.worker == "h-7"


def test_a_workers_slots_are_its_limit_on_the_servers_list_of_task_workers(monkeypatch):
    """``hyperband worker --limit N``'s identifier on the server ends in its slots; a job counts the slots of the
    workers serving its code (one for a worker that says none: no --limit, another version, Prefect's own)."""
    import asyncio

    from prefect_hyperband.app.worker import _slots_worker

    async def identifiers():  # (Prefect's TaskWorker is made inside an event loop)
        return [_slots_worker()(task_workers.trial_rung, limit=n).client_id for n in (3, None)]

    limited, unlimited = asyncio.run(identifiers())
    assert limited.endswith("~slots=3") and "~slots=" not in unlimited
    assert [worker_slots.slots_of(w) for w in (limited, unlimited, "h-1~slots=x", "~slots=4", "h-2~slots=0")] == \
        [3, 1, 1, 1, 1]
    key = task_workers.key_of(None)
    client = _Client([{"identifier": limited, "task_keys": [key]}, {"identifier": unlimited, "task_keys": [key]},
                      {"identifier": "other~slots=8", "task_keys": ["trial_rung-0badc0de"]}])
    import prefect.client.orchestration as orchestration

    class _Sync:
        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(orchestration, "get_client", lambda sync_client=False: _Sync())
    from prefect_hyperband.flows.task_workers import key_of

    assert worker_slots.slot_count(key_of(None)) == 4  # 3 + 1; the other code's 8 are not the job's


def test_task_workers_need_a_server_the_workers_reach_and_no_trial_pool():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.flows.params import TuneParams

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert TuneParams(model="synthetic", task_workers=True).task_workers
        with pytest.raises(ValueError, match="task_workers and trial_pool p together"):
            TuneParams(model="synthetic", task_workers=True, trial_pool="p")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(ValueError, match="needs a Prefect server that hyperband workers reach"):
            TuneParams(model="synthetic", task_workers=True)


def test_a_worker_without_a_server_or_with_a_bad_limit_is_one_line_exit_2(capsys, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.app.cli import main

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert main(["worker"]) == 2
    assert capsys.readouterr().err == ("hyperband: error: a worker serves the Prefect server its jobs use: set "
                                       "PREFECT_API_URL (http://host:4200/api)\n")
    assert main(["worker", "--limit", "-1"]) == 2
    assert capsys.readouterr().err == "hyperband: error: --limit must be >= 0, got -1\n"


def test_parameters_travel_through_the_jobs_storage_where_one_is_given(tmp_path, prefect_harness):
    """On an object store, a block saved on the server (Prefect refuses an unsaved one as a background task's
    result storage: the job failed at its first submission), once per process."""
    from prefect.filesystems import RemoteFileSystem

    assert task_parameters.parameter_storage(None) is None  # Prefect's task-scheduling storage
    assert task_parameters.parameter_storage(str(tmp_path)) == tmp_path.resolve() / "task-parameters"
    assert task_parameters.parameter_storage(f"file://{tmp_path}") == tmp_path.resolve() / "task-parameters"
    remote = task_parameters.parameter_storage("s3://bucket/jobs/")
    assert isinstance(remote, RemoteFileSystem) and remote.basepath == "s3://bucket/jobs/task-parameters"
    assert remote._block_document_id is not None and task_parameters.parameter_storage("s3://bucket/jobs") is remote
    assert task_workers.served("s3://bucket/jobs").result_storage is remote


def test_a_task_run_a_worker_deleted_is_lost_with_the_likely_cause_in_one_line():
    """Prefect's task worker deletes a task run whose parameters it cannot read: the trial-rung runs again, and the
    line names the storage the worker needs."""
    from types import SimpleNamespace

    from prefect.exceptions import ObjectNotFound

    from prefect_hyperband.flows.work_pool import TrialRunLost

    class Gone:
        def read_task_run(self, run_id):
            raise ObjectNotFound(http_exc=Exception("404"))

    with pytest.raises(TrialRunLost, match=r"could not read its parameters \(--storage s3://b/j\); start "
                                           r"`hyperband worker --storage s3://b/j`"):
        task_workers._state(Gone(), "run-1", SimpleNamespace(task_storage="s3://b/j"))
    with pytest.raises(TrialRunLost, match=r"\(the default task-scheduling storage\); start `hyperband worker` "):
        task_workers._state(Gone(), "run-1", SimpleNamespace(task_storage=None))


def test_the_job_sees_a_trial_rungs_result_in_its_folder_before_the_server_hears_the_run_end(tmp_path, monkeypatch):
    from prefect_hyperband.executors.storage import Storage

    store = Storage(str(tmp_path), str(tmp_path))
    assert not task_workers._landed(store, "results/a.json", 0.05)
    store.write_json("results/a.json", {"done": True})
    assert task_workers._landed(store, "results/a.json", 60)  # at once, not after the 60 s
    slept = []
    monkeypatch.setattr(task_workers.time, "sleep", slept.append)
    remote = type("Remote", (), {"local": False})()
    assert not task_workers._landed(remote, "results/a.json", 0.2) and slept == [0.2]  # an object store: no looks


def test_a_prefect_api_away_for_a_while_is_waited_for_with_one_line_and_past_the_bound_is_the_jobs_error(
        monkeypatch):
    import logging

    import httpx

    records: list[logging.LogRecord] = []
    keep = logging.Handler(logging.INFO)
    keep.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("prefect_hyperband.flows.api_wait")
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "disabled", False)  # a logging.config of another test's may have disabled it
    logger.addHandler(keep)
    monkeypatch.setitem(api_wait._OUTAGE, "since", None)
    monkeypatch.setattr(api_wait.time, "sleep", lambda seconds: None)
    answers = iter([httpx.ConnectError("All connection attempts failed")] * 3 + ["state"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setitem(api_wait._OUTAGE, "back", None)
    try:
        assert api_wait.answering(call) == ("state", True)
        assert api_wait.answering(lambda: "again") == ("again", False)
        # a restarted server's 503s while it starts its services, seconds after it answered: the same outage
        answers = iter([httpx.HTTPStatusError("503 Service Unavailable", request=None, response=None), "later"])
        assert api_wait.answering(call) == ("later", True)
    finally:
        logger.removeHandler(keep)
    said = [r for r in records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "the Prefect API does not answer (ConnectError" in said[0].getMessage()
    assert any("answers again" in r.getMessage() for r in records)
    with pytest.raises(ValueError):  # not an outage: at once
        api_wait.answering(lambda: (_ for _ in ()).throw(ValueError("bad request")))
    monkeypatch.setattr(api_wait, "API_WAIT_AT_LEAST", 0.0)
    monkeypatch.setattr(api_wait, "client_waits", lambda: 0.0)
    clock = iter(range(0, 100, 10))
    monkeypatch.setattr(api_wait.time, "monotonic", lambda: next(clock))
    with pytest.raises(httpx.ConnectError):  # past --service-wait: the loop stops the job (exit 75)
        api_wait.answering(lambda: (_ for _ in ()).throw(httpx.ConnectError("refused")))


def test_the_jobs_slots_follow_the_workers_counted_every_few_seconds_and_keep_the_last_count_while_the_server_is_away(
        monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(task_workers.time, "monotonic", lambda: clock[0])
    counts = iter([3, RuntimeError("the server is away"), 1])

    def count():
        answer = next(counts)
        if isinstance(answer, Exception):
            raise answer
        return answer

    slots = worker_slots.LiveSlots(2, count)
    assert slots() == 2  # counted when the job began
    clock[0] = worker_slots.SLOTS_EVERY
    assert slots() == 3  # a worker joined
    clock[0] += 1
    assert slots() == 3  # not counted again before SLOTS_EVERY
    clock[0] += worker_slots.SLOTS_EVERY
    assert slots() == 3  # the server away: the last count
    clock[0] += worker_slots.SLOTS_EVERY
    assert slots() == 1  # two left


def test_a_stopping_worker_knows_the_task_runs_its_prefect_task_worker_took():
    from types import SimpleNamespace
    from uuid import uuid4

    from prefect_hyperband.app.worker import _taken

    run = uuid4()
    assert _taken([SimpleNamespace(taken={run})]) == [run] and _taken([]) == []


def test_a_task_run_its_worker_took_as_the_api_went_away_is_sent_again_quietly_once_the_api_answers(
        tmp_path, monkeypatch):
    """Prefect's task worker that receives a task run just as the server goes cannot begin it (its "Failed to submit
    task run") and drops it: PENDING for good. After the outage the job sends it again without a line, not after
    the PENDING timeout (twice the heartbeat timeout) with a warning."""
    from types import SimpleNamespace

    import httpx
    import prefect.client.orchestration as orchestration
    from prefect.client.schemas.objects import StateType

    from prefect_hyperband.hyperband.trial import TrialRung

    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds

    monkeypatch.setattr(task_workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(task_workers.time, "sleep", sleep)
    monkeypatch.setitem(api_wait._OUTAGE, "since", None)
    monkeypatch.setitem(api_wait._OUTAGE, "back", None)
    answers = iter([httpx.ConnectError("All connection attempts failed")] * 20)
    marked: list = []

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read_task_run(self, run_id):
            clock[0] += 0.01
            answer = next(answers, None)
            if answer is not None:
                raise answer
            return SimpleNamespace(state=SimpleNamespace(type=StateType.PENDING, is_final=lambda: False))

        def set_task_run_state(self, run_id, state, force):
            marked.append((run_id, state.type, force))

    store = SimpleNamespace(local=True, url=lambda key: str(tmp_path / key), read_json=lambda key: None,
                            delete=lambda key: None)
    job = SimpleNamespace(job_id="j", task_storage=None, to_json=lambda: "{}", store=lambda: store)
    monkeypatch.setattr(orchestration, "get_client", lambda sync_client: Client())
    monkeypatch.setattr(task_workers, "_outside_runs", lambda submitted, **_: SimpleNamespace(task_run_id="run-1"))
    one = TrialRung(trial_id="s2-0004", bracket=2, rung=0, resource=1, config={}, checkpoint=None)
    with pytest.raises(task_workers._AfterOutage, match="pending since the Prefect API was away"):
        task_workers._on_workers(job, one)
    assert [(run, kind.value, force) for run, kind, force in marked] == [("run-1", "CANCELLED", True)]
    assert 0 < clock[0] - 20 * api_wait.API_RETRY_SECONDS < task_workers.OUTAGE_PENDING + 1


def test_what_a_job_says_of_its_workers_is_said_once_per_job_not_per_trial_rung(monkeypatch):
    monkeypatch.setattr(task_workers, "_SAID", {})
    said = "1 hyperband worker(s) serve other code"
    assert task_workers._first_time("job-a", said) and not task_workers._first_time("job-a", said)
    assert task_workers._first_time("job-b", said)  # another job says it too
    for n in range(task_workers.SAID_JOBS):  # a long-lived process keeps the latest jobs' sentences only
        task_workers._first_time(f"job-{n}", said)
    assert len(task_workers._SAID) == task_workers.SAID_JOBS and "job-a" not in task_workers._SAID
    assert task_workers._first_time("job-a", "no hyperband worker is connected to this Prefect server")


def test_a_trial_rung_sent_again_has_no_cache_key_on_a_worker_and_keeps_its_name_and_task_key():
    """Prefect's task worker gives a task of ``NO_CACHE`` its ``DEFAULT`` policy (keyed on the inputs and the flow
    run: a trial-rung sent again in one flow run came back from the cache, untrained); ours it keeps, and its key is
    none. A trial-rung's task run is named for it, and the name does not change the task's key (what workers serve)."""
    import asyncio

    from prefect.task_worker import TaskWorker

    async def served():
        return TaskWorker(task_workers.trial_rung).tasks[0]

    task = asyncio.run(served())
    assert isinstance(task.cache_policy, task_workers._NoCache)
    assert task.cache_policy.compute_key(None, {"job": {}, "rung": {}}, {}) is None
    named = task_workers.trial_rung.with_options(name="s2-0001 to r=3")
    assert named.name == "s2-0001 to r=3" and named.task_key == task_workers.trial_rung.task_key
