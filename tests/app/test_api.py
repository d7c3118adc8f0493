"""``hb.tune``'s signature is derived from ``TuneParams``: every field its ``**options`` takes is listed."""

from __future__ import annotations

import inspect
import textwrap

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


#: ``hb.tune`` in a process of its own without ``PREFECT_API_URL`` (a fresh ``PREFECT_HOME``): bad input refused before
#: any server starts, then a job on the temporary server it starts; what it saw, as JSON
FIRST_CALLS = textwrap.dedent("""
    import json, sys
    import prefect_hyperband as hb
    from prefect_hyperband.flows.server import OUR_APP
    from prefect_hyperband.tasks import prefect_internals

    SPACE = {"x": {"type": "float", "low": 0, "high": 1}}
    refused = []
    for bad in ({"space": SPACE, "concurency": 2}, {"space": "nope.yaml"}, {"space": SPACE, "train": lambda a, b: {}}):
        options = {"train": lambda trial: {"loss": trial.config["x"]}, "metric": "loss", "direction": "minimize",
                   **bad}
        try:
            hb.tune(options.pop("train"), options.pop("space"), **options)
        except Exception as exc:
            refused.append([type(exc).__name__, str(exc)[:500], len(prefect_internals.temporary_servers())])
    result = hb.tune(lambda trial: {"loss": trial.config["x"]}, SPACE, metric="loss", direction="minimize",
                     max_resource=3, eta=3, seed=1, tracking_uri=sys.argv[1])
    servers = [" ".join(prefect_internals.process_of(s).args) for s in prefect_internals.temporary_servers()]
    print(json.dumps({"refused": refused, "servers": servers, "ours": OUR_APP,
                      "trial_rungs": result.summary["trial_rungs"]}))
""")


@pytest.mark.slow
def test_tune_refuses_bad_input_before_any_server_and_runs_on_the_clis_temporary_server(tmp_path):
    """Without ``PREFECT_API_URL``, ``hb.tune`` checks its input as the CLI's preflight does (bad input is the
    exception itself, before a server or a flow run: it was raised after a flow run had begun and failed, its
    traceback in Prefect's log), then starts the server the CLI starts (batched writes, ``flows.server``'s app), not
    the one Prefect would start on its own. Run for real, in a process of its own (before: both mocked)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "PREFECT_HOME"))}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", HYPERBAND_NO_LIVE="1")
    (tmp_path / "calls.py").write_text(FIRST_CALLS)
    done = subprocess.run([sys.executable, "calls.py", f"sqlite:///{tmp_path / 'mlflow.db'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [kind for kind, _, _ in seen["refused"]] == ["ValidationError", "SpaceError", "InputError"], seen
    assert "concurency" in seen["refused"][0][1]
    assert "search space file 'nope.yaml' not found" in seen["refused"][1][1]
    assert "must take one argument, the trial" in seen["refused"][2][1]
    assert all(servers == 0 for _, _, servers in seen["refused"])  # no server started for bad input
    assert len(seen["servers"]) == 1 and f"--factory {seen['ours']}" in seen["servers"][0]
    assert seen["trial_rungs"] == 6  # R=3, eta 3: 3 at r=1 and 1 at r=3, then 2 at r=3


def test_a_prefect_api_that_cannot_start_the_job_is_waited_for_then_one_exception(capsys, tracking_uri):
    """As the CLI: while the API does not answer (a port nothing listens on, for real), one warning line and a wait
    of ``service_wait``; past it a ``ConnectionError`` in one line, nothing run."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_hyperband.common.ports import free_port

    gone = f"http://127.0.0.1:{free_port()}/api"
    with temporary_settings(updates={PREFECT_API_URL: gone}):
        with pytest.raises(ConnectionError, match=r"^the Prefect API could not start job \S+ within 2 s "
                                                  r"\(service_wait\); nothing ran, call tune again$"):
            hb.tune(lambda trial: {"loss": 0.0}, space={"x": {"type": "float", "low": 0, "high": 1}}, metric="loss",
                    direction="minimize", service_wait=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("hyperband: warning: the Prefect API cannot start the job's flow run")
    assert "ConnectError" in err[0] and err[1].startswith("hyperband: error: the Prefect API could not start job")


def test_the_code_given_twice_or_a_stop_that_is_no_token_is_one_clear_type_error():
    """Found by a fuzz of the API: ``trainer=`` beside ``train`` said "TuneParams() got multiple values for keyword
    argument 'trainer'"; a ``stop`` that is no ``StopToken`` failed deep in the loop, with an ``AttributeError``."""
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    with pytest.raises(TypeError, match=r"tune\(\) takes the code as its first argument, train .*; drop trainer="):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize", trainer="m:f")
    with pytest.raises(TypeError, match="stop must be a prefect_hyperband StopToken, got str"):
        hb.tune(lambda trial: {"loss": 0.0}, space=space, metric="loss", direction="minimize", stop="now")


def test_a_resume_from_python_takes_the_saved_schedule_unless_it_is_given(prefect_harness, tracking_uri, tmp_path):
    """``hb.tune(..., resume=True, job_id=J)`` was refused for "max_resource=81" the caller never gave: the schedule's
    defaults went in as given values (found by a fuzz of the API). A real job of R=9, resumed without its schedule
    and with it; a schedule that differs is refused."""
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    common = dict(metric="loss", direction="minimize", job_id="resumed", job_dir=str(tmp_path / "jobs"),
                  register_model=False)

    def train(trial):
        return {"loss": trial.config["x"]}

    first = hb.tune(train, space, max_resource=9, eta=3, seed=2, **common)
    for schedule in ({}, {"max_resource": 9}):
        again = hb.tune(train, space, resume=True, **schedule, **common)
        assert again.summary["trial_rungs"] == first.summary["trial_rungs"] and again.best_score == first.best_score
    with pytest.raises(Exception, match="max_resource"):
        hb.tune(train, space, resume=True, max_resource=27, **common)
