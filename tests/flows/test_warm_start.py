"""--warm-start: jobs of the same store seed a new one (same data and space: observations; otherwise: the parents'
best configs first, or as PriorBand's priors); the parent run names them; a resume keeps what it began from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow_runs import runs_of  # noqa: E402  (tests/flows)

from prefect_hyperband.app.cli import main
from prefect_hyperband.flows.params import TuneParams

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _tune(tmp_path: Path, job_id: str, max_resource: int = 3, **fields):
    from prefect_hyperband.flows.tune import tune

    fields.setdefault("model", "synthetic")
    return tune(TuneParams(max_resource=max_resource, eta=3, job_dir=str(tmp_path), job_id=job_id,
                           experiment="warm", baseline=False, importance="none", **fields))


def _state(result) -> dict:
    return json.loads((Path(result["job_dir"]) / "state.json").read_text())["scheduler"]


def test_same_data_and_space_the_parents_results_teach_tpe_and_a_resume_keeps_them(tracking_uri, tmp_path):
    parent = _tune(tmp_path, "A", 9, sampler="tpe", seed=1)
    child = _tune(tmp_path, "B", 9, sampler="tpe", seed=1, warm_start=["A"], patience=1)
    assert child["warm_start"]["kind"] == "identical" and child["warm_start"]["parents"] == ["A"]
    assert "warm start from A (identical): same data, model, metric and space: their 22 results are told to TPE" \
        in child["table"]
    sampler = _state(child)["sampler"]
    assert sampler["kind"] == "warm" and sampler["parents"] == ["A"]
    assert list(_state(child)["brackets"])[0] == "2"  # widest first, as a cold job (the bracket of r=1 configs)
    told = sum(len(v) for v in sampler["inner"]["observations"].values())
    assert told == 22 + child["summary"]["trial_rungs"]  # the parent's 22 results, then the job's own
    # its draws are its own: not the parent's configs again, though both have seed 1
    parent_configs = {json.dumps(c["config"], sort_keys=True) for b in _state(parent)["brackets"].values()
                      for c in b["trials"].values()}
    child_configs = [json.dumps(c["config"], sort_keys=True) for b in _state(child)["brackets"].values()
                     for c in b["trials"].values()]
    assert not parent_configs & set(child_configs)
    # the best of both jobs, as SageMaker's overall best: the child stopped early (patience 1), the parent's may win
    theirs, mine = parent["best"], child["best"]
    won = ("A", theirs) if (theirs["score"], "A") < (mine["score"], "B") else ("B", mine)  # val_loss: lower; a tie: B
    assert child["overall_best"] == {"job_id": won[0], "trial_id": won[1]["trial_id"], "resource": won[1]["resource"],
                                     "score": won[1]["score"]}
    assert f"overall best of this job and A (same data and space): val_loss {won[1]['score']:.4f}, " in child["table"]
    client, run, _ = runs_of(tracking_uri, "warm", child["parent_run_id"])
    assert run.data.metrics["overall_best_val_loss"] == pytest.approx(won[1]["score"])
    assert parent["overall_best"] is None  # not warm-started
    assert run.data.tags["hyperband.warm_start"] == "A" and run.data.tags["hyperband.warm_start.kind"] == "identical"
    assert run.data.params["warm_start"] == "A" and "this job: no data set read; A: no data set read" == \
        run.data.tags["hyperband.warm_start.data"]
    # the parent gone, the child resumed (a looser criterion): its plan and its sampler's observations are its own
    assert child["stopped_by"]
    shutil.rmtree(tmp_path / "A")
    resumed = _tune(tmp_path, "B", 9, resume=True, patience=100)
    assert resumed["warm_start"]["parents"] == ["A"] and "warm start from A (identical)" in resumed["table"]
    assert resumed["summary"]["trial_rungs"] == 22


def test_another_space_the_parents_best_configs_go_first_clipped_or_become_priorband_s_priors(tracking_uri, tmp_path):
    parent = _tune(tmp_path, "A", seed=2)
    best = parent["best"]["config"]
    narrow = {"x": {"type": "float", "low": 0.0, "high": round(best["x"] / 2, 4)}, "y": {"type": "float", "low": 0.0,
                                                                                         "high": 1.0}}
    child = _tune(tmp_path, "B", seed=2, space=narrow, warm_start=["A"])
    assert child["warm_start"]["kind"] == "transfer"
    assert "A: another space: their best config is drawn first, clipped to this space" in child["table"]
    first = _state(child)["brackets"]["1"]["trials"]["s1-0000"]["config"]
    assert first == {"x": narrow["x"]["high"], "y": best["y"]}
    # with PriorBand: the parents' best is the prior of each parameter the user gave none
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.5, "confidence": "high"},
             "y": {"type": "float", "low": 0.0, "high": 0.9}}
    child = _tune(tmp_path, "C", seed=2, sampler="priorband", space=space, warm_start=["A"])
    assert "the best config (y: no prior of yours) is the space's prior" in child["table"]
    record = json.loads((tmp_path / "C" / "job.json").read_text())
    assert record["warm"]["space"]["x"]["prior"] == 0.5  # the user's own prior stays
    assert record["warm"]["space"]["y"]["prior"] == pytest.approx(min(best["y"], 0.9))


def test_random_asha_on_the_same_data_draws_the_parents_best_first(tracking_uri, tmp_path):
    parent = _tune(tmp_path, "A", 9, mode="asha", max_trials=8, seed=4)
    child = _tune(tmp_path, "B", 9, mode="asha", max_trials=8, seed=4, warm_start=["A"])
    assert "the random sampler learns nothing from results, so their 3 best configs are drawn first" in child["table"]
    theirs = _state(parent)["state"]["trials"].values()
    at_r = [t["config"] for t in theirs if t["resource"] == 9]
    mine = list(_state(child)["state"]["trials"].values())  # in the order they were started
    assert mine[0]["config"] in at_r  # the first of the parent's best: one it trained to R
    assert all(t["config"] in [c["config"] for c in theirs] for t in mine[:3])
    assert all(t["config"] not in [c["config"] for c in theirs] for t in mine[3:])


def test_an_unknown_job_or_a_space_with_nothing_in_common_is_one_line_and_exit_2(tracking_uri, tmp_path, capsys):
    _tune(tmp_path, "A", seed=5)
    for argv, message in [
        (["--warm-start", "nope"], "--warm-start nope: no job 'nope' under "),
        (["--model", "xgboost", "--warm-start", "A"], "--warm-start A: its space (x, y) has nothing in common "
                                                       "with this job's (eta, "),
        (["--job-id", "A2", "--warm-start", "A2"], "--warm-start A2: a job cannot start from itself"),
    ]:
        capsys.readouterr()
        assert main(["tune", "--model", "synthetic", "--max-resource", "3", "--job-dir", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_the_data_is_compared_by_its_content_not_its_split(tracking_uri, tmp_path):
    """XGBoost: another data set is a transfer (the parent run names both digests); the same data on another split
    (seed) is the same data."""
    fast = {"model": "xgboost", "rounds_per_unit": 2}
    _tune(tmp_path, "A", data="breast-cancer", seed=0, **fast)
    b = _tune(tmp_path, "B", data="digits", seed=1, warm_start=["A"], **fast)
    assert b["warm_start"]["kind"] == "transfer"
    assert "A: other data (breast-cancer, digest " in b["warm_start"]["note"]
    c = _tune(tmp_path, "C", data="digits", seed=2, sampler="tpe", warm_start=["B"], **fast)
    assert c["warm_start"]["kind"] == "identical"
    _, run, _ = runs_of(tracking_uri, "warm", c["parent_run_id"])
    mine, theirs = run.data.tags["hyperband.warm_start.data"].split("; ")
    assert mine.startswith("this job: digits ") and theirs == "B: " + mine.split(": ")[1]
