"""``hb.tune``'s signature is derived from ``TuneParams``: every field its ``**options`` takes is listed."""

from __future__ import annotations

import inspect

import pydantic
import pytest

import prefect_hyperband as hb
from prefect_hyperband.flows.params import TuneParams


def test_every_field_is_a_keyword_of_tune_with_the_fields_default():
    params = inspect.signature(hb.tune).parameters
    assert list(params)[:2] == ["train", "space"]
    for name, field in TuneParams.model_fields.items():
        if name in {"trainer", "script", "model"}:  # ``train`` names the user's code
            assert name not in params
            continue
        assert name in params, name
        if name in {"space", "metric", "direction"}:  # tune's own: the space is required, the metric may be a map
            continue
        assert params[name].default == field.default, name
    assert params["concurrency"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["max_resource"].default == TuneParams.model_fields["max_resource"].default


def test_an_option_that_is_no_field_is_refused_before_anything_runs():
    with pytest.raises(pydantic.ValidationError, match="concurency"):
        hb.tune(lambda trial: {"loss": 0.0}, space={"x": {"type": "float", "low": 0, "high": 1}}, metric="loss",
                direction="minimize", concurency=2)


def test_tune_starts_the_clis_temporary_server_once_its_parameters_are_valid(monkeypatch, tracking_uri):
    """Without ``PREFECT_API_URL``, ``hb.tune`` starts the server the CLI starts (batched writes, ``flows.server``'s
    app), not the one Prefect would start on its own; after the parameters are checked, before the flow."""
    from prefect_hyperband.flows import process
    from prefect_hyperband.flows import tune as tune_module

    calls: list[str] = []

    class Started(Exception):
        pass

    def flow(params, return_state):
        calls.append("flow")
        raise Started

    monkeypatch.setattr(process, "temporary_server", lambda: calls.append("server"))
    monkeypatch.setattr(tune_module, "tune", flow)
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    with pytest.raises(pydantic.ValidationError):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize", concurency=2)
    assert calls == []
    with pytest.raises(Started):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize")
    assert calls == ["server", "flow"]


def test_input_the_job_would_refuse_raises_before_a_server_or_a_flow_run(monkeypatch, tracking_uri):
    """As the CLI's preflight: the job's checks run before its server and its flow run, so bad input is the
    exception itself (it was raised after a flow run had begun and failed, its traceback in Prefect's log)."""
    from prefect_hyperband.flows import process
    from prefect_hyperband.flows import tune as tune_module
    from prefect_hyperband.hyperband.space import SpaceError
    from prefect_hyperband.common.errors import InputError

    calls: list[str] = []
    monkeypatch.setattr(process, "temporary_server", lambda: calls.append("server"))
    monkeypatch.setattr(tune_module, "tune", lambda params, return_state: calls.append("flow"))
    with pytest.raises(SpaceError, match="search space file 'nope.yaml' not found"):
        hb.tune(lambda trial: {"loss": 0.0}, space="nope.yaml", metric="loss", direction="minimize")
    with pytest.raises(InputError, match="must take one argument, the trial"):
        hb.tune(lambda a, b: {"loss": 0.0}, space={"x": {"type": "float", "low": 0, "high": 1}}, metric="loss",
                direction="minimize")
    assert calls == []


def test_a_prefect_api_that_cannot_start_the_job_is_waited_for_then_one_exception(monkeypatch, capsys, tracking_uri):
    """As the CLI: while the API's database is down, one warning line and a wait of ``service_wait``; past it a
    ``ConnectionError`` in one line, the flow never called."""
    from prefect_hyperband.app import starting
    from prefect_hyperband.flows import process
    from prefect_hyperband.flows import tune as tune_module

    class Clock:
        now = 0.0

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    called: list[str] = []
    monkeypatch.setattr(process, "temporary_server", lambda: None)
    monkeypatch.setattr(tune_module, "tune", lambda params, return_state: called.append(params.job_id))
    monkeypatch.setattr(starting, "time", Clock())
    monkeypatch.setattr(starting, "api_not_ready", lambda: "503 Service Unavailable for GET http://h/api/ready")
    with pytest.raises(ConnectionError, match=r"^the Prefect API could not start job \S+ within 10 s \(service_wait\); "
                                              r"nothing ran, call tune again$"):
        hb.tune(lambda trial: {"loss": 0.0}, space={"x": {"type": "float", "low": 0, "high": 1}}, metric="loss",
                direction="minimize", service_wait=10)
    assert called == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("hyperband: warning: the Prefect API cannot start the job's flow run")
    assert err[1].startswith("hyperband: error: the Prefect API could not start job")


def test_the_code_given_twice_or_a_stop_that_is_no_token_is_one_clear_type_error():
    """Found by a fuzz of the API: ``trainer=`` beside ``train`` said "TuneParams() got multiple values for keyword
    argument 'trainer'"; a ``stop`` that is no ``StopToken`` failed deep in the loop, with an ``AttributeError``."""
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    with pytest.raises(TypeError, match=r"tune\(\) takes the code as its first argument, train .*; drop trainer="):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize", trainer="m:f")
    with pytest.raises(TypeError, match="stop must be a prefect_hyperband StopToken, got str"):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize", stop="now")


def test_a_resume_from_python_takes_the_saved_schedule_unless_it_is_given(monkeypatch):
    """``hb.tune(..., resume=True, job_id=J)`` was refused for "max_resource=81" the caller never gave: the schedule's
    defaults went in as given values (found by a fuzz of the API)."""
    from prefect_hyperband.flows import prepare as prepare_module

    seen = []

    class Checked(Exception):
        pass

    def resolve(params):
        seen.append(params.model_fields_set)
        raise Checked

    monkeypatch.setattr(prepare_module, "resolve", resolve)
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    for schedule in ({}, {"max_resource": 9}):
        with pytest.raises(Checked):
            hb.tune("m:train", space, metric="loss", direction="minimize", resume=True, job_id="j", **schedule)
    assert not {"max_resource", "eta", "min_resource"} & seen[0] and "max_resource" in seen[1]
    with pytest.raises(TypeError, match="train must be a function or its entry .*, got NoneType"):
        hb.tune(None, space, metric="loss", direction="minimize")
