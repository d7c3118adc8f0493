"""Which writer a job gets (``tracking.writer.writer_for``): a process only where results can come tens a second."""

from __future__ import annotations

import pytest

from prefect_hyperband.tracking.writer import ThreadWriter, make_writer, writer_for


@pytest.mark.parametrize("concurrency, mode, max_trials, budget, kind", [
    (2, "hyperband", None, None, "thread"),
    (4, "asha", 300, None, "thread"),
    (16, "hyperband", None, None, "process"),
    (4, "asha", 500, None, "process"),
    (4, "asha", None, 600.0, "process"),
    (4, "hyperband", 5000, None, "thread"),  # max_trials is ASHA's
])
def test_a_process_writes_where_results_come_fast(monkeypatch, concurrency, mode, max_trials, budget, kind):
    monkeypatch.delenv("HYPERBAND_MLFLOW_WRITER", raising=False)
    assert writer_for(concurrency, mode, max_trials, budget) == kind


@pytest.mark.parametrize("forced", ["process", "thread"])
def test_the_environment_decides_for_every_job(monkeypatch, forced):
    monkeypatch.setenv("HYPERBAND_MLFLOW_WRITER", forced)
    assert writer_for(2, "hyperband", None, None) == forced
    assert writer_for(256, "asha", 10_000, None) == forced


def test_a_thread_writer_answers_in_order():
    writer = make_writer("thread")
    assert isinstance(writer, ThreadWriter)
    assert writer.submit("ping").result(timeout=10) == __import__("os").getpid()  # this process: no child
    writer.shutdown()


def test_the_clis_writer_started_ahead_is_the_jobs_and_keeps_the_service_wait(monkeypatch):
    """``start_ahead`` (the CLI, before Prefect's temporary server): the job's ``make_writer("process")`` takes that
    process, which began with ``--service-wait``'s bound on MLflow's retries in its environment; a thread job's
    CLI starts nothing."""
    import os

    from prefect_hyperband.tracking import writer as module

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setattr(module, "_ahead", [])
    module.start_ahead("thread", 30.0)
    assert module._ahead == []
    module.start_ahead("process", 30.0)
    ahead = module._ahead[0]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the bound was the child's only
    taken = make_writer("process")
    try:
        assert taken is ahead and module._ahead == []
        pid = taken.submit("ping").result(timeout=60)
        assert pid == taken.proc.pid != os.getpid()
        environ = dict(line.split("=", 1) for line in open(f"/proc/{pid}/environ").read().split("\0") if "=" in line)
        assert int(environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) >= 2  # 30 s of MLflow's backoff: more than one retry
    finally:
        taken.shutdown()
    assert taken.proc.returncode == 0


def test_a_process_writer_takes_calls_while_its_process_reads_none_and_answers_them_in_order():
    """The job's loop never waits on the writer process's stdin (a 64 KiB pipe): calls are queued and sent by a
    thread of the writer's own. Here the process is stopped (SIGSTOP) while calls of 256 KiB each are submitted;
    once it goes on, each is answered in order (``ping`` takes no argument: each answer is its TypeError)."""
    import os
    import signal
    import threading

    from prefect_hyperband.tracking.writer import ProcessWriter

    writer = ProcessWriter()
    assert writer.submit("ping").result(timeout=60) == writer.proc.pid  # its imports done
    os.kill(writer.proc.pid, signal.SIGSTOP)
    futures: list = []
    try:
        submitting = threading.Thread(target=lambda: futures.extend(writer.submit("ping", b"x" * 2**18)
                                                                    for _ in range(4)))
        submitting.start()
        submitting.join(timeout=30)
        assert not submitting.is_alive(), "submit waited for the process to read"
        assert len(futures) == 4 and not any(f.done() for f in futures)
    finally:
        os.kill(writer.proc.pid, signal.SIGCONT)
    last = writer.submit("ping")
    assert all(isinstance(f.exception(timeout=60), TypeError) for f in futures)
    assert last.result(timeout=60) == writer.proc.pid
    writer.shutdown()
    assert writer.proc.returncode == 0


def test_a_trial_completed_by_its_result_at_r_is_tagged_with_that_result_and_its_close_only_ends_the_run(
        tmp_path, monkeypatch):
    """A scored result at R completes its trial: its close's tags go in the result's batch, and the close writes no
    tags again (one write fewer per completed trial); a trial closed below R, or with other tags, gets its tags."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from prefect_hyperband.executors.result import Outcome
    from prefect_hyperband.hyperband.scheduler import TrialRecord
    from prefect_hyperband.hyperband.trial import TrialRung
    from prefect_hyperband.tracking import runs as tracking
    from prefect_hyperband.tracking.writer import TrialRuns
    from prefect_hyperband.trainers.base import Evaluation, TrainResult

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("e")).info.run_id
    job = SimpleNamespace(tracking_uri=uri, metric_key="val_loss", max_resource=9, parent_run_id=parent,
                          settings=SimpleNamespace(model="synthetic", workers=1, data=None))
    tag_writes: list[str] = []
    real_set_tags = tracking.set_tags
    monkeypatch.setattr(tracking, "set_tags", lambda u, run_id, tags: tag_writes.append(run_id) or real_set_tags(
        u, run_id, tags))
    runs = TrialRuns()

    def result(trial_id, rung, resource, loss):
        trial_rung = TrialRung(trial_id=trial_id, bracket=0, rung=rung, resource=resource, config={"x": 1}, checkpoint=None)
        trained = TrainResult(checkpoint="ck", resource=resource, resource_trained=resource, seconds=0.1, workers=1)
        return runs.record(job, trial_id, 0, 0.0, None, Outcome(trial_rung, trained, Evaluation(loss, 0.0), None),
                           {"x": 1} if rung == 0 else None, None)

    done, nan, low = result("s0-0000", 2, 9, 0.25), result("s0-0001", 2, 9, float("nan")), result("s0-0002", 0, 1, 0.5)
    runs.close(job, [TrialRecord("s0-0000", 0, {}, "completed", 2, 9, {9: 0.25}, None),
                     TrialRecord("s0-0001", 0, {}, "failed", 2, 9, {9: None}, "failed"),
                     TrialRecord("s0-0002", 0, {}, "stopped", 0, 1, {1: 0.5}, None)], {})
    assert sorted(tag_writes) == sorted([nan, low])  # the completed one's tags came with its result
    for run_id, status, ended in ((done, "completed", "FINISHED"), (nan, "failed", "FAILED"), (low, "stopped", "FINISHED")):
        run = client.get_run(run_id)
        assert run.data.tags["hyperband.status"] == status and run.info.status == ended, (run_id, run.data.tags)
    assert client.get_run(done).data.tags["hyperband.resource"] == "9" and not runs.tagged
