"""A trial-rung's tasks taken by value: an error inside a task is the trial's (its task run Failed, as the Prefect UI
shows it), an error of the orchestration around it is raised for the loop to run the trial-rung again."""

from __future__ import annotations

import pytest
from prefect import flow, get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from prefect_hyperband.flows.runner import _value
from prefect_hyperband.tasks.trials import _marks_its_errors, trial_error


@task(name="inside", cache_policy=NO_CACHE, persist_result=False)
@_marks_its_errors
def inside(x: int) -> int:
    if x < 0:
        raise ValueError("a bad config")
    return 2 * x


@task(name="around", cache_policy=NO_CACHE, persist_result=False)
def around(x: int) -> int:
    raise ConnectionError("simulated: the API went away")


def test_a_tasks_value_its_own_error_returned_and_an_error_around_it_raised(prefect_harness):
    @flow(name="values")
    def values() -> tuple:
        ok, failed = _value(inside, 3), _value(inside, -1)
        with pytest.raises(ConnectionError, match="the API went away"):
            _value(around, 1)
        return ok, failed

    state = values(return_state=True)
    ok, failed = state.result()
    assert ok == 6
    assert isinstance(failed, ValueError) and trial_error(failed) and str(failed) == "a bad config"
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
            any_=[state.state_details.flow_run_id]))) if r.name.startswith("inside")]
    assert sorted(r.state.type.value for r in runs) == ["COMPLETED", "FAILED"]  # the same states as before
