"""A lost controller's leftovers (issue 40, item 4): its flow run and what ran under it end Crashed on resume;
child runs of trials the resumed job never trains end KILLED. On the session's Prefect server and a fresh MLflow."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

from prefect_hyperband.flows.lost import end_lost_flow_run, end_orphan_runs

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _lost_flow_run():
    """A job's flow run as a SIGKILLed process leaves it: Running, a group's subflow run Running under it, a task
    run Running in the group."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="hyperband-tune")
    def job():
        pass

    @flow(name="hyperband-group")
    def group():
        pass

    @task(name="train")
    def train():
        pass

    with get_client(sync_client=True) as c:
        parent = c.create_flow_run(job, state=Running())
        opens = c.create_task_run(train.with_options(name="hyperband-group"), parent.id, "group-0", state=Running())
        child = c.create_flow_run(group, parent_task_run_id=opens.id, state=Running())
        training = c.create_task_run(train, child.id, "train-0", state=Running())
    return parent.id, child.id, training.id


def _state(kind: str, run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        run = c.read_flow_run(run_id) if kind == "flow" else c.read_task_run(run_id)
    return run.state.type.value, run.state.message


class Lines:
    """A logger that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args) -> None:
        self.lines.append(message % args)

    info = warning


def test_the_lost_flow_run_and_everything_open_under_it_end_crashed_naming_the_resume():
    parent, child, training = _lost_flow_run()
    logger = Lines()
    ended = end_lost_flow_run({"host": "h1", "pid": 42, "flow_run_id": str(parent)}, "new-run", logger)
    assert ended == 2, logger.lines
    for kind, run_id in [("flow", parent), ("flow", child), ("task", training)]:
        state, message = _state(kind, run_id)
        assert state == "CRASHED" and "host h1, pid 42" in message and "flow run new-run" in message
    assert logger.lines == [
        f"the job's previous process (host h1, pid 42) was lost; its flow run {parent} and 1 under it ended Crashed"]
    # a second resume finds nothing open: nothing is said or changed
    assert end_lost_flow_run({"flow_run_id": str(parent)}, "newer-run", logger) == 0


def test_a_flow_run_the_api_does_not_know_is_one_warning_and_the_job_goes_on():
    logger = Lines()
    assert end_lost_flow_run({"flow_run_id": "not-a-uuid"}, "new-run", logger) == 0
    assert len(logger.lines) == 1 and "could not end the lost flow run not-a-uuid" in logger.lines[0]


def test_child_runs_of_trials_the_job_never_trained_end_killed(tracking_uri):
    from types import SimpleNamespace

    from prefect_hyperband.tracking import runs as tracking

    parent = tracking.start_parent(tracking_uri, "lost", "job", {}, {})
    kept = tracking.create_child(tracking_uri, parent, "t1", {"hyperband.trial_id": "t1"})
    orphan = tracking.create_child(tracking_uri, parent, "t9", {"hyperband.trial_id": "t9"})
    job = SimpleNamespace(tracking_uri=tracking_uri)
    ended = end_orphan_runs(job, [SimpleNamespace(trial_id="t1")], {"t1": kept, "t9": orphan}, Lines())
    assert ended == [orphan]
    client, _, children = runs_of(tracking_uri, "lost", parent)
    status = {c.info.run_id: (c.info.status, c.data.tags.get("hyperband.status")) for c in children}
    assert status == {kept: ("RUNNING", None), orphan: ("KILLED", "abandoned")}


def test_a_resume_after_the_controller_was_lost_crashes_its_flow_run(tracking_uri, tmp_path):
    """The lock a SIGKILLed job left names its flow run: the job that takes the lock over ends it."""
    from prefect_hyperband.app import cli

    parent, child, _ = _lost_flow_run()
    jobs = tmp_path / "jobs"
    (jobs / "lost").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (jobs / "lost" / "lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                                    "flow_run_id": str(parent)}))
    code = cli.main(["tune", "--model", "synthetic", "--max-resource", "3", "--eta", "3", "--no-baseline",
                     "--job-dir", str(jobs), "--job-id", "lost"])
    assert code == 0
    assert _state("flow", parent)[0] == "CRASHED" and _state("flow", child)[0] == "CRASHED"
    assert f"pid {dead.pid}" in _state("flow", parent)[1]
    assert not (jobs / "lost" / "lock").exists()
