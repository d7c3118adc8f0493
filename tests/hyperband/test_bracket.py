from __future__ import annotations

import json

from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.hyperband.schedule import brackets
from prefect_hyperband.hyperband.space import parse

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def start(s: int = 3, seed: int = 0) -> BracketState:
    plan = {b.s: b for b in brackets(1, 27, 3)}
    return BracketState.start(plan[s], 3, SPACE, seed, "max")


def run_rung(state: BracketState, score=lambda t, cfg: cfg["x"], fail=()):
    for t in state.pending():
        value = None if t in fail else score(t, state.trials[t].config)
        state.record(t, state.current.resource, value, f"/ckpt/{t}/{state.current.resource}")
    return state.advance()


def test_bracket_promotes_top_third_each_rung_up_to_R():
    state = start()
    sizes = []
    while not state.done:
        sizes.append((len(state.active), state.current.resource))
        run_rung(state)
    assert sizes == [(27, 1), (9, 3), (3, 9), (1, 27)]
    completed = [t for t in state.trials.values() if t.status == "completed"]
    assert len(completed) == 1
    best = max(state.trials.values(), key=lambda t: t.config["x"])
    assert completed[0].trial_id == best.trial_id
    assert state.scores(completed[0].trial_id) == {1: best.config["x"], 3: best.config["x"], 9: best.config["x"], 27: best.config["x"]}
    assert sum(t.status == "stopped" for t in state.trials.values()) == 26


def test_promoted_trials_resume_from_their_checkpoint():
    state = start()
    promoted = run_rung(state)
    assert all(state.trials[t].checkpoint == f"/ckpt/{t}/1" and state.trials[t].resource == 1 for t in promoted)


def test_failed_trials_are_recorded_and_never_promoted():
    state = start()
    everyone = list(state.active)
    failing = set(everyone[:20])
    promoted = run_rung(state, fail=failing)
    assert len(promoted) == 7  # only 7 trials succeeded; a failure never fills a slot
    assert not failing & set(promoted)
    assert all(state.trials[t].status == "failed" and state.scores(t)[1] is None for t in failing)


def test_same_seed_same_configs_and_promotions():
    a, b, c = start(seed=5), start(seed=5), start(seed=6)
    assert [t.config for t in a.trials.values()] == [t.config for t in b.trials.values()]
    assert [t.config for t in a.trials.values()] != [t.config for t in c.trials.values()]
    assert run_rung(a) == run_rung(b)


def test_state_round_trips_through_json_mid_bracket():
    state = start()
    run_rung(state)
    restored = BracketState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored == state
    assert run_rung(restored) == run_rung(state)


def _as_saved_before_one_trial_type(state: BracketState) -> dict:
    """``state`` as the brackets wrote it before a trial was one type in both modes: each trial's scores on the
    trial (resource -> score), its ``rung`` the highest recorded (-1: none), no ``in_flight``, no ``results``."""
    raw = json.loads(json.dumps(state.to_json()))
    results = raw.pop("results")
    for t, v in raw["trials"].items():
        recorded = [k for k, r in enumerate(results) if t in r]
        v["rung"] = max(recorded, default=-1)
        v["scores"] = {str(state.rungs[k].resource): results[k][t] for k in recorded}
        del v["in_flight"]
    return raw


def test_a_bracket_saved_in_the_earlier_format_loads_as_the_same_state():
    state = start()
    run_rung(state)  # rung 0 closed: 9 promoted, waiting for their r=3 results
    half = state.pending()[:4]
    for t in half:  # mid-rung: some of rung 1 recorded, the rest still to come
        state.record(t, 3, state.trials[t].config["x"], f"/ckpt/{t}/3")
    old = _as_saved_before_one_trial_type(state)
    assert old["trials"][half[0]]["rung"] == 1 and old["trials"][state.pending()[0]]["rung"] == 0
    loaded = BracketState.from_json(old)
    assert loaded == state
    assert loaded.pending() == state.pending() and len(loaded.pending()) == 5
    assert run_rung(loaded) == run_rung(state)
