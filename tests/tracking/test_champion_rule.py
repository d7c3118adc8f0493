"""Which version holds ``@champion``: the pure rule (``champion.decide``) and the registration on a real store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefect_hyperband.tracking import champion
from prefect_hyperband.tracking.champion import CHALLENGER, CHAMPION, Standing, decide, incomparable, standing_of

AUC = Standing(0.80, "val_auc", "max", "d1")


def test_the_first_version_and_the_same_version_again_take_the_champion():
    assert decide(AUC, 1, None, None)[0] == CHAMPION
    assert decide(AUC, 4, AUC, 4)[0] == CHAMPION  # a retry of the job that registered it: no comparison with itself


@pytest.mark.parametrize("direction, new, alias", [
    ("max", 0.81, CHAMPION), ("max", 0.79, CHALLENGER), ("max", 0.80, CHALLENGER),  # a tie keeps the champion
    ("min", 0.79, CHAMPION), ("min", 0.81, CHALLENGER),
])
def test_a_score_takes_the_champion_only_when_it_beats_the_current_one_in_the_metrics_direction(direction, new, alias):
    current = Standing(0.80, "val_loss", direction, "d1")
    got, line = decide(Standing(new, "val_loss", direction, "d1"), 4, current, 3)
    assert got == alias
    assert "version 3" in line and "version 4" in line


def test_forced_the_new_version_takes_the_champion_even_when_worse():
    assert decide(Standing(0.1, "val_auc", "max", "d1"), 4, AUC, 3, force=True)[0] == CHAMPION


@pytest.mark.parametrize("current", [
    Standing(0.99, "val_auc", "max", "other-data"),  # another validation set
    Standing(0.99, "val_logloss", "min", "d1"),  # another metric
    Standing(0.99, "val_auc", "min", "d1"),  # another direction
    None,  # no score tags: an older release registered it
])
def test_scores_that_cannot_be_compared_give_the_new_version_the_champion_and_say_why(current):
    new = Standing(0.5, "val_auc", "max", "d1")
    why = incomparable(new, current, 3)
    assert why and "version 3" in why
    got, line = decide(new, 4, current, 3)
    assert got == CHAMPION and why in line


def test_a_jobs_without_data_of_its_own_compare_on_metric_and_direction():
    assert incomparable(Standing(0.5, "loss", "min"), Standing(0.4, "loss", "min"), 1) == ""
    assert decide(Standing(0.5, "loss", "min"), 2, Standing(0.4, "loss", "min"), 1)[0] == CHALLENGER


def test_a_standing_goes_through_a_versions_tags_and_missing_or_broken_tags_are_none():
    assert Standing.of(AUC.tags()) == AUC
    assert Standing.of(Standing(0.5, "loss", "min").tags()) == Standing(0.5, "loss", "min")
    assert Standing.of({"hyperband.job_id": "j"}) is None
    assert Standing.of({**AUC.tags(), champion.SCORE: "nan"}) is None
    assert Standing.of({**AUC.tags(), champion.SCORE: "x"}) is None


def test_a_new_versions_standing_is_the_jobs_metric_first_on_the_validation_digest():
    got = standing_of({"val_auc": 0.8, "latency_ms": 3.0}, "max", SimpleNamespace(digest="abc"))
    assert got == Standing(0.8, "val_auc", "max", "abc")
    assert standing_of({"val_auc": 0.8}, "max") == Standing(0.8, "val_auc", "max", "")
    assert standing_of(None, "max") is None and standing_of({"val_auc": float("nan")}, "max") is None


# ---- on a real store: each registration as the job's end makes it


def _store(tmp_path, monkeypatch):
    import mlflow

    from prefect_hyperband.tracking import runs as tracking

    monkeypatch.chdir(tmp_path)  # the models' artifacts
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    experiment = c.create_experiment("e")

    class Constant(mlflow.pyfunc.PythonModel):
        def predict(self, model_input: list[str], params: dict | None = None) -> list[str]:
            return model_input

    def log_model(trainer, checkpoint, tags=None):
        return mlflow.pyfunc.log_model(name="model", python_model=Constant(), pip_requirements=[], tags=tags)

    model = SimpleNamespace(log_model=log_model)

    def register(job: str, score: float, digest: str = "d1", force: bool = False, direction: str = "max"):
        run_id = c.create_run(experiment).info.run_id
        return champion.log_champion(uri, run_id, model, lambda: None, "/ckpt", "e", {"val_auc": score},
                                     lambda: SimpleNamespace(name="v", digest=digest), step=3, job_id=job,
                                     direction=direction, force=force), run_id

    return c, uri, register


def _aliases(c) -> dict[str, int]:
    return {alias: int(v) for alias, v in c.get_registered_model("e").aliases.items()}


def test_on_a_store_the_better_version_holds_the_champion_the_other_is_challenger_and_force_moves_it(tmp_path,
                                                                                                     monkeypatch):
    c, uri, register = _store(tmp_path, monkeypatch)
    first, _ = register("j1", 0.8053)
    assert (first.version, first.alias) == (1, CHAMPION)
    worse, worse_run = register("j2", 0.8035)
    assert (worse.version, worse.alias) == (2, CHALLENGER) and "0.8053" in worse.line and "0.8035" in worse.line
    assert _aliases(c) == {CHAMPION: 1, CHALLENGER: 2}
    tags = c.get_model_version("e", "2").tags
    assert Standing.of(tags) == Standing(0.8035, "val_auc", "max", "d1")
    # the same job's registration written again (--resume, a retry): the same version, the same decision
    again = champion.log_champion(uri, worse_run, None, lambda: None, "/ckpt", "e", {"val_auc": 0.8035}, None,
                                  step=3, job_id="j2")
    assert (again.version, again.alias) == (2, CHALLENGER) and len(c.search_model_versions("name = 'e'")) == 2
    better, _ = register("j3", 0.81)
    assert (better.version, better.alias) == (3, CHAMPION) and _aliases(c) == {CHAMPION: 3, CHALLENGER: 2}
    forced, _ = register("j4", 0.5, force=True)
    assert forced.alias == CHAMPION and _aliases(c)[CHAMPION] == 4
    other, _ = register("j5", 0.1, digest="d2")  # other validation data: not comparable, the new one takes it
    assert other.alias == CHAMPION and _aliases(c)[CHAMPION] == 5 and "other data" in other.line


def test_on_a_store_a_champion_without_score_tags_gives_way_to_a_scored_version(tmp_path, monkeypatch):
    c, _, register = _store(tmp_path, monkeypatch)
    register("j1", 0.9)
    for key in (champion.SCORE, champion.METRIC, champion.DIRECTION, champion.DIGEST):  # as an older release left it
        c.delete_model_version_tag("e", "1", key)
    got, _ = register("j2", 0.5)
    assert got.alias == CHAMPION and _aliases(c) == {CHAMPION: 2} and "no score" in got.line
