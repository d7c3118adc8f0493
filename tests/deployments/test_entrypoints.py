"""deployments/prefect.yaml: valid for Prefect 3.8.8, every entrypoint a flow, every parameter set a TuneParams;\n``hyperband deploy`` deploys the same set from the installed package."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"


def _config() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _deployments() -> list[dict]:
    """The tuning jobs (the ``hyperband-tune`` flow, a parameter per field)."""
    return [d for d in _config()["deployments"] if d["entrypoint"].endswith(":tune")]


def _studies() -> list[dict]:
    """The scaling studies (the ``hyperband-scale`` flow)."""
    return [d for d in _config()["deployments"] if d["entrypoint"].endswith(":scale")]


def _load(entrypoint: str):
    """Import ``package.module:function`` as a worker does (``prefect.flows.load_flow_from_entrypoint``)."""
    module, _, name = entrypoint.partition(":")
    assert module.startswith("prefect_hyperband.") and name and not module.endswith(".py"), (
        f"entrypoint must be a module path in the package (loads from a wheel too), got {entrypoint!r}"
    )
    return getattr(importlib.import_module(module), name)


def test_prefect_yaml_validates_with_prefects_own_model():
    from prefect.cli.deploy._models import PrefectYamlModel

    raw = _config()
    model = PrefectYamlModel.model_validate(raw)  # prefect deploy skips a file that fails this, with a warning
    assert [d.name for d in model.deployments] == ["xgboost-bank-marketing", "torch-digits", "sklearn-digits-example",
                                                 "torch-digits-scaling"]
    assert len({d.name for d in model.deployments}) == len(model.deployments)
    for d in model.deployments:
        assert d.work_pool is not None and d.work_pool.name == "hyperband-process"


def test_pull_step_sets_the_working_directory_to_the_project_root():
    raw = _config()
    build = raw["build"]
    assert build == [
        {"prefect.deployments.steps.run_shell_script": {"id": "project-root", "script": "pwd", "stream_output": False}}
    ]
    pull = raw["pull"]
    assert pull == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ project-root.stdout }}"}}]


def test_one_deployment_has_a_schedule_made_paused():
    schedules = {d["name"]: d.get("schedules") or [] for d in _deployments()}
    assert any(schedules.values())
    assert not any(item.get("active", True) for items in schedules.values() for item in items)
    from prefect.client.schemas.schedules import CronSchedule

    for items in schedules.values():
        for item in items:
            CronSchedule(cron=item["cron"], timezone=item.get("timezone"))


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_entrypoint_is_a_prefect_flow_taking_a_parameter_per_field(deployment):
    from prefect import Flow

    from prefect_hyperband.flows.params import TuneParams

    flow = _load(deployment["entrypoint"])
    assert isinstance(flow, Flow)
    assert flow.name == "hyperband-tune"
    assert set(inspect.signature(flow.fn).parameters) == {*TuneParams.model_fields, "params"}
    assert set(deployment["parameters"]) <= set(TuneParams.model_fields)


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_parameters_validate_against_tune_params(deployment):
    from prefect_hyperband.flows.params import TuneParams

    params = TuneParams.model_validate(deployment["parameters"])
    assert params.model == deployment["parameters"]["model"]


@pytest.mark.parametrize("deployment", _deployments() + _studies(), ids=lambda d: d["name"])
def test_parameters_validate_against_the_deployment_schema(deployment):
    """What the server checks on `prefect deploy` (enforce_parameter_schema defaults to true)."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    flow = _load(deployment["entrypoint"])
    schema = parameter_schema(flow).model_dump_for_openapi()
    validate(deployment["parameters"], schema, raise_on_error=True, preprocess=True, ignore_required=False)


def test_models_match_the_deployment_names():
    by_name = {d["name"]: d["parameters"] for d in _deployments()}
    assert by_name["xgboost-bank-marketing"]["model"] == "xgboost"
    assert by_name["torch-digits"] == {**by_name["torch-digits"], "model": "torch", "data": "digits"}


def test_entrypoint_loads_through_prefect_as_a_worker_does():
    from prefect.flows import load_flow_from_entrypoint

    for deployment in _deployments():
        assert load_flow_from_entrypoint(deployment["entrypoint"]).name == "hyperband-tune"


def test_the_packaged_prefect_yaml_is_this_one():
    from prefect_hyperband.app import deploy

    assert deploy.prefect_yaml().read_text() == PREFECT_YAML.read_text()
    assert [d["name"] for d in deploy.bundled()] == [d["name"] for d in _config()["deployments"]]
    assert {d["entrypoint"] for d in _deployments()} == {deploy.ENTRYPOINT}


def test_every_bundled_deployment_runs_with_the_prefect_clients_retries_of_500():
    """A deployment run's process retries what a Prefect server answers while its database restarts, as the CLI's
    own process does (``app/cli.py``); ``hyperband deploy`` passes the pool's env of the packaged prefect.yaml."""
    from prefect_hyperband.app import deploy

    for d in deploy.bundled():
        env = d["work_pool"]["job_variables"]["env"]
        assert env["PREFECT_CLIENT_RETRY_EXTRA_CODES"] == "500" and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_the_cli_and_the_bundled_pool_set_the_prefect_client_alike(monkeypatch):
    """The two places these settings are written (``cli._env`` for the CLI's process, the packaged prefect.yaml's
    pool env for a deployment run's) say the same."""
    from prefect_hyperband.app import cli, deploy

    for name in ("PREFECT_CLIENT_MAX_RETRIES", "PREFECT_CLIENT_RETRY_EXTRA_CODES", "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.setenv(name, "x")  # recorded, so that what ``_env`` sets is undone after the test
        monkeypatch.delenv(name)
    cli._env()
    pool = deploy.bundled()[0]["work_pool"]["job_variables"]["env"]
    assert {k: os.environ[k] for k in pool} == pool


def test_the_scaling_study_deployment_is_the_scale_flow_with_valid_params():
    from prefect import Flow

    from prefect_hyperband.flows.params import TuneParams

    (study,) = _studies()
    flow = _load(study["entrypoint"])
    assert isinstance(flow, Flow) and flow.name == "hyperband-scale"
    assert set(study["parameters"]) <= set(inspect.signature(flow.fn).parameters)
    assert TuneParams.model_validate(study["parameters"]["params"]).model == "torch"
    assert study["parameters"]["workers"] == [1, 2]


def test_hyperband_deploy_rejects_an_unknown_deployment_in_one_line(capsys, monkeypatch):
    from prefect_hyperband.app import cli

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert cli.main(["deploy", "--name", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("hyperband: error: unknown deployment 'nosuch'; "
                   "choose from xgboost-bank-marketing, torch-digits, sklearn-digits-example, torch-digits-scaling")


def test_hyperband_deploy_needs_a_server(capsys, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.app import cli

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # (the session's harness, if this worker started it)
        assert cli.main(["deploy"]) == 2
    assert "set PREFECT_API_URL" in capsys.readouterr().err


def test_the_user_code_deployment_validates_and_its_trainer_loads():
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.trainers.function import load

    params = TuneParams.model_validate(next(d for d in _deployments() if d["name"] == "sklearn-digits-example")["parameters"])
    assert params.model == "function" and isinstance(params.space, dict)
    assert callable(load(params.trainer))  # importable from the installed package, wherever the worker runs
