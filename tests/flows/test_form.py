"""The tune flow's parameters as Prefect users give them: flat (one per field, the form's order), merged over a
deployment's values, bad combinations a Failed run with one line, a run's name kept or made telling."""

from __future__ import annotations

import pytest

from prefect_hyperband.flows import form, run_name
from prefect_hyperband.flows.params import TuneParams, flat


def _schema() -> dict:
    from prefect_hyperband.flows.tune import tune

    return tune.parameters.model_dump_for_openapi()


def test_the_form_has_one_field_per_parameter_the_common_ones_first():
    properties = _schema()["properties"]
    assert set(properties) == {*TuneParams.model_fields, form.LEGACY}
    by_position = sorted(properties, key=lambda name: properties[name]["position"])
    assert by_position[:6] == ["model", "data", "target", "metric", "direction", "max_resource"]
    assert by_position[-1] == form.LEGACY  # the legacy object last, below every field
    assert all(properties[name].get("description") for name in properties)
    assert {"minimize", "maximize"} <= set(properties["direction"]["enum"])  # a drop-down, not a free string
    assert properties["max_resource"]["minimum"] == 1  # the model's constraints: the form refuses a bad value


def test_given_values_merge_over_a_legacy_object_and_defaults_are_not_given():
    defaults = {name: field.default for name, field in TuneParams.model_fields.items()}
    legacy = {"model": "synthetic", "max_resource": 27, "tracking_uri": "http://127.0.0.1:5000", "experiment": "x"}
    params, was_legacy = form.from_flow({**defaults, "max_resource": 9, form.LEGACY: legacy})
    assert was_legacy and params.max_resource == 9 and params.tracking_uri == "http://127.0.0.1:5000"
    assert params.model_fields_set == {"model", "max_resource", "tracking_uri", "experiment"}
    params, was_legacy = form.from_flow({**defaults, "eta": 4})
    assert not was_legacy and params.model_fields_set == {"eta"}
    whole = TuneParams(model="synthetic", max_resource=3)
    assert form.from_flow({form.LEGACY: whole}) == (whole, False)  # a Python caller's TuneParams, as it is


def test_flat_gives_back_the_fields_given():
    params = TuneParams(model="synthetic", max_resource=9, job_id="j")
    assert flat(params) == {"model": "synthetic", "max_resource": 9, "job_id": "j"}
    assert form.from_flow({**flat(params)})[0] == params


@pytest.mark.parametrize("name, made_up", [("brave-otter", True), ("hyperband-tune", True), ("", True),
                                           ("nightly R=9", False), ("my-own-run", False), ("nightly-run", False)])
def test_prefects_generated_names_are_told_from_given_ones(name, made_up):
    assert run_name.generated(name) is made_up


def test_every_generated_name_is_recognised():
    from prefect.utilities.names import generate_slug

    assert all(run_name.generated(generate_slug(2)) for _ in range(200))


@pytest.mark.usefixtures("prefect_harness")
def test_a_bad_combination_fails_the_run_with_one_line_and_no_traceback(tracking_uri):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from prefect_hyperband.flows.tune import tune

    state = tune(model="synthetic", min_resource=5, max_resource=3, return_state=True)
    assert state.is_failed()
    assert "min_resource" in state.message and "max_resource" in state.message
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    errors = [log.message for log in logs if log.level >= 40]
    assert errors == [state.message]
    assert not any("Traceback" in log.message for log in logs)


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_keeps_a_given_name_and_otherwise_says_what_it_is(tracking_uri, tmp_path):
    from prefect.client.orchestration import get_client

    from prefect_hyperband.flows.tune import tune

    common = dict(model="synthetic", max_resource=3, eta=3, baseline=False, register_model=False,
                  job_dir=str(tmp_path), importance="none")
    named = tune.with_options(flow_run_name="nightly R=3")(**common, job_id="named", return_state=True)
    first = tune(**common, job_id="first", return_state=True)
    legacy = tune(params={**common, "job_id": "legacy"}, return_state=True)  # an earlier hyperband deploy's
    assert named.is_completed() and first.is_completed() and legacy.is_completed()
    with get_client(sync_client=True) as client:
        names = [client.read_flow_run(s.state_details.flow_run_id).name for s in (named, first, legacy)]
    assert names[0] == "nightly R=3"
    assert "synthetic" in names[1] and "R=3" in names[1] and "first" in names[1]
    assert "legacy" in names[2] and names[1] != names[2]
