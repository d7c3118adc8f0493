"""Trial-rungs grouped into subflow runs (``flows.groups``): a bracket per group, ASHA by rung and by count."""

from __future__ import annotations

import threading
import time

import pytest

from prefect_hyperband.flows.groups import Groups
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.hyperband.first import PRIOR_BRACKET
from prefect_hyperband.hyperband.scheduler import Decision
from prefect_hyperband.hyperband.trial import TrialRung


def _trial_rung(i: int, bracket: int = 0, resource: int = 1) -> TrialRung:
    return TrialRung(f"{i:04d}", bracket, 0, resource, {}, None)


def test_asha_groups_by_rung_open_until_the_job_ends(monkeypatch):
    started: list[str] = []
    groups = Groups("asha", size=2)
    monkeypatch.setattr(groups, "_start", lambda g: (started.append(g.title), g.ready.set()))
    taken = [groups._take(_trial_rung(i, resource=r)) for i, r in enumerate([1, 1, 3, 1])]
    assert started == ["r=1 · trial-rungs", "r=3 · trial-rungs"]  # a rung is not split by count (flows.groups)
    assert taken[0] is taken[1] is taken[3]
    for g in taken:
        groups._release(g)
    assert not taken[0].done.is_set()
    groups.close()
    assert taken[0].done.is_set() and taken[2].done.is_set() and not groups.open
    assert groups._take(_trial_rung(9, bracket=PRIOR_BRACKET)) is None  # the priors' mode stays in the job's run


def test_a_bracket_is_one_group_that_ends_with_its_last_rung_and_holds_its_promotes(monkeypatch):
    groups = Groups("hyperband", size=3)
    monkeypatch.setattr(groups, "_start", lambda g: g.ready.set())
    taken = [groups._take(_trial_rung(i, bracket=2)) for i in range(4)]
    assert [g.title for g in taken] == ["bracket s=2"] * 3 + ["bracket s=2 · part 2"]
    for g in taken:
        groups._release(g)
    assert not any(g.done.is_set() for g in taken)  # a bracket's group waits for its rungs to close
    here = []
    taken[-1].context = __import__("contextvars").copy_context()
    groups.in_bracket(2, lambda: here.append("promote"))
    groups.settled([Decision("rung_closed", 2, 0, 1, None, 3)])
    assert not any(g.done.is_set() for g in taken)
    groups.settled([Decision("rung_closed", 2, 2, 9, None, 3)])
    assert all(g.done.is_set() for g in taken) and here == ["promote"] and not groups.open
    # a group ended while the job ran is still waited for at the job's end: its run's last log line comes first
    finishing = threading.Event()
    taken[0].thread = threading.Thread(target=finishing.wait)
    taken[0].thread.start()
    threading.Timer(0.05, finishing.set).start()
    groups.close()
    assert not taken[0].thread.is_alive()


def test_a_bracket_that_begins_starts_the_next_brackets_group_once_its_own_subflow_runs(monkeypatch):
    upcoming = [4, 3, 1]  # s=2 is done (a resumed job): its group is never started again
    groups = Groups("hyperband", upcoming=upcoming)
    started: list[tuple[str, threading.Event | None]] = []
    monkeypatch.setattr(groups, "_start", lambda g, after=None: started.append((g.title, after)))
    first = groups._take(_trial_rung(0, bracket=4))
    assert started == [("bracket s=4", None), ("bracket s=3", first.ready)]  # s=3's starts once s=4's runs
    groups._take(_trial_rung(1, bracket=4))
    ahead = groups._take(_trial_rung(2, bracket=3))  # s=3 begins in the group started ahead; s=1's starts after it
    assert ahead.title == "bracket s=3" and started[2:] == [("bracket s=1", ahead.ready)]
    groups._take(_trial_rung(3, bracket=1))
    assert len(started) == 3  # the last bracket: nothing after it
    asha = Groups("asha", upcoming=upcoming)
    monkeypatch.setattr(asha, "_start", lambda g, after=None: started.append((g.title, after)))
    asha._take(_trial_rung(4, bracket=4))
    assert started[3:] == [("r=1 · trial-rungs", None)]  # ASHA's rungs open as results reach them


def test_a_group_started_ahead_whose_job_ends_first_starts_no_subflow_run_and_does_not_delay_the_end(monkeypatch):
    from prefect_hyperband.flows import groups as module

    called: list[str] = []
    monkeypatch.setattr(module, "flow", lambda **kw: (lambda body: called.append))  # a subflow run that never runs
    groups = Groups("hyperband", upcoming=[2, 1])
    first = groups._take(_trial_rung(0, bracket=2))  # s=1's group waits for s=2's run, which never starts
    ahead = groups.open[("bracket", 1, 0)]
    began = time.monotonic()
    groups.close()
    assert time.monotonic() - began < 2  # not the join's 10 s: the group started ahead saw the job end
    assert called == ["bracket s=2"] and not first.thread.is_alive() and not ahead.thread.is_alive()
    assert ahead.ready.is_set() and ahead.context is None  # ended without a subflow run


def test_a_group_started_ahead_whose_subflow_run_fails_is_started_again_by_its_bracket_without_a_warning(monkeypatch):
    from prefect_hyperband.flows import groups as module

    tried: list[str] = []

    def once_away(**kw):  # the API away as s=1's group starts ahead, back when its bracket begins
        def wrap(body):
            def run(title):
                tried.append(title)
                if tried.count(title) == 1 and title == "bracket s=1":
                    raise ConnectionError("All connection attempts failed")
                body(title)
            return run
        return wrap

    monkeypatch.setattr(module, "flow", once_away)
    warned: list[str] = []
    groups = Groups("hyperband", warn=warned.append, upcoming=[2, 1])
    first = groups._take(_trial_rung(0, bracket=2))
    assert first.ready.wait(5) and first.context is not None
    deadline = time.monotonic() + 5
    while ("bracket", 1, 0) in groups.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("bracket", 1, 0) not in groups.open  # withdrawn: none of its trial-rungs was dealt
    later = groups._take(_trial_rung(1, bracket=1))  # its bracket begins: the group starts as any group does
    assert later is not first and later.ready.wait(5) and later.context is not None
    assert tried == ["bracket s=2", "bracket s=1", "bracket s=1"] and warned == []
    groups.close()


def test_a_group_whose_subflow_run_does_not_start_runs_its_trial_rungs_in_the_job_run(monkeypatch):
    warned: list[str] = []
    groups = Groups("asha", size=5, warn=warned.append)

    def broken(group):
        group.thread = threading.Thread(target=groups._failed, args=(group, "RuntimeError: no API"))
        group.thread.start()

    monkeypatch.setattr(groups, "_start", broken)
    for i in range(2):
        context, release = groups.enter(_trial_rung(i))
        assert context is None  # the job's own run
        release()
    assert len(warned) == 1 and "RuntimeError: no API" in warned[0]
    assert not any(g.active for g in groups.open.values())
    groups.close()


@pytest.mark.usefixtures("prefect_harness")
def test_an_asha_job_runs_in_one_subflow_run_per_rung(tracking_uri, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    from prefect_hyperband.flows.tune import tune

    state = tune(TuneParams(model="synthetic", mode="asha", max_resource=9, eta=3, max_trials=10, concurrency=3,
                            job_dir=str(tmp_path), experiment="asha-groups", baseline=False), return_state=True)
    trial_rungs = state.result()["summary"]["trial_rungs"]
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])))
        assert subflows and all(g.state.is_completed() for g in subflows)
        assert sorted(g.name for g in subflows) == ["r=1 · trial-rungs", "r=3 · trial-rungs", "r=9 · trial-rungs"]
        deadline, trained = time.monotonic() + 150, {}
        while time.monotonic() < deadline:  # the server records task runs from their events, within a second or so
            trained = {g.name: [t.name for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[g.id])), limit=200) if t.name.startswith("train")]
                for g in subflows}
            if sum(map(len, trained.values())) >= trial_rungs:
                break
            time.sleep(0.5)
    assert sum(map(len, trained.values())) == trial_rungs
    for name, names in trained.items():  # each trial-rung under its rung's group: train <trial> to r=<its r>
        assert names and all(n.endswith(f"r={name.split(' ')[0][2:]}") for n in names), (name, names[:3])


def test_the_job_s_own_lines_reach_the_prefect_ui_and_its_task_runs_info_lines_do_not():
    """Prefect's flow-run and task-run loggers share one API handler: the filter keeps the flow run's INFO lines."""
    import logging

    from prefect_hyperband.flows.process import _TASK_RUN_INFO

    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "line", None, None)

    assert _TASK_RUN_INFO.filter(record("prefect.flow_runs", logging.INFO))  # "asha: ... results, best ..."
    assert not _TASK_RUN_INFO.filter(record("prefect.task_runs", logging.INFO))  # "Finished in state Completed()"
    assert _TASK_RUN_INFO.filter(record("prefect.task_runs", logging.WARNING))


@pytest.mark.usefixtures("prefect_harness")
def test_a_job_s_logs_in_the_api_are_its_own_lines_and_its_task_runs_tab_reads(tracking_uri, tmp_path):
    """Read back from the API: the job's lines are its flow run's logs, no task run's INFO line is; every task
    run's inputs are other task runs' results or parameters (a group subflow returns nothing to link to)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    from prefect_hyperband.flows.tune import tune

    state = tune(TuneParams(model="synthetic", max_resource=9, eta=3, concurrency=2, job_dir=str(tmp_path),
                            experiment="logs", baseline=False), return_state=True)
    job_run = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            lines = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[job_run])))]
            if any(m.startswith("bracket s=0 rung 1/1") for m in lines):
                break
            time.sleep(0.5)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[job_run])))
    assert any(m.startswith("job ") for m in lines) and any(m.startswith("bracket s=2 rung 1/3") for m in lines)
    assert not [m for m in lines if m.startswith("Finished in state Completed()") and "task" in m.lower()]
    for t in tasks:
        for inputs in t.task_inputs.values():
            assert all(i.input_type in ("task_run", "parameter", "constant") for i in inputs), (t.name, inputs)
