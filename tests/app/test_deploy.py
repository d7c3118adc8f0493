"""``hyperband deploy``: the bundled deployments with a parameter per field, their schedules paused unless asked."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _pool(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


@pytest.mark.parametrize("active", [False, True])
def test_the_schedules_are_made_paused_unless_asked(active, tmp_path):
    from prefect.client.orchestration import get_client

    from prefect_hyperband.app import deploy
    from prefect_hyperband.flows.params import TuneParams

    _pool("deploy-test")
    (done,) = deploy.deploy("deploy-test", tmp_path, ["xgboost-bank-marketing"], active=active)
    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(done.name)
    assert [s.active for s in found.schedules] == [active]
    assert set(found.parameters) <= set(TuneParams.model_fields) and found.parameters["max_resource"] == 27
    form = found.parameter_openapi_schema["properties"]
    first_ten = sorted(form, key=lambda name: form[name]["position"])[:10]
    assert "max_resource" in first_ten
