"""deployments/prefect.yaml: valid for Prefect 3.8.8, every entrypoint a flow, every parameter set a TuneParams."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"


def _config() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _deployments() -> list[dict]:
    return _config()["deployments"]


def _load(entrypoint: str):
    """Import ``path/to/file.py:function`` relative to the project root, as a worker does after its pull step."""
    path, _, name = entrypoint.partition(":")
    assert path and name, f"entrypoint must be path.py:function, got {entrypoint!r}"
    file = ROOT / path
    assert not Path(path).is_absolute() and file.is_file(), f"entrypoint file {path} not in the project"
    spec = importlib.util.spec_from_file_location(f"_entrypoint_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_prefect_yaml_validates_with_prefects_own_model():
    from prefect.cli.deploy._models import PrefectYamlModel

    raw = _config()
    model = PrefectYamlModel.model_validate(raw)  # prefect deploy skips a file that fails this, with a warning
    assert [d.name for d in model.deployments] == ["xgboost-bank-marketing", "torch-digits"]
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


def test_one_deployment_has_a_schedule():
    schedules = {d["name"]: d.get("schedules") or [] for d in _deployments()}
    assert any(schedules.values())
    from prefect.client.schemas.schedules import CronSchedule

    for items in schedules.values():
        for item in items:
            CronSchedule(cron=item["cron"], timezone=item.get("timezone"))


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_entrypoint_is_a_prefect_flow_taking_params(deployment):
    from prefect import Flow

    flow = _load(deployment["entrypoint"])
    assert isinstance(flow, Flow)
    assert flow.name == "hyperband-tune"
    assert list(inspect.signature(flow.fn).parameters) == ["params"]
    assert set(deployment["parameters"]) == {"params"}


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_parameters_validate_against_tune_params(deployment):
    from flows.params import TuneParams

    params = TuneParams.model_validate(deployment["parameters"]["params"])
    assert params.model == deployment["parameters"]["params"]["model"]


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_parameters_validate_against_the_deployment_schema(deployment):
    """What the server checks on `prefect deploy` (enforce_parameter_schema defaults to true)."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    flow = _load(deployment["entrypoint"])
    schema = parameter_schema(flow).model_dump_for_openapi()
    validate(deployment["parameters"], schema, raise_on_error=True, preprocess=True, ignore_required=False)


def test_models_match_the_deployment_names():
    by_name = {d["name"]: d["parameters"]["params"] for d in _deployments()}
    assert by_name["xgboost-bank-marketing"]["model"] == "xgboost"
    assert by_name["torch-digits"] == {**by_name["torch-digits"], "model": "torch", "data": "digits"}
