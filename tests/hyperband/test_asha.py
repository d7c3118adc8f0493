"""ASHA (Li et al., MLSys 2020, Algorithm 2): promotions by hand, rung order, bracket shares, resume, determinism."""

from __future__ import annotations

import copy
import json
from collections import Counter, deque

import numpy as np
import pytest

from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.promotion import sort_key
from prefect_hyperband.hyperband.schedule import brackets
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.hyperband.trial import TrialRung

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "int", "low": 1, "high": 9}})


def counter_configs():
    n = iter(range(10**6))
    return lambda: {"n": next(n)}


def best(state: AshaState) -> tuple[str, int, float] | None:
    """The best (trial id, resource, score) seen at any rung, as the paper returns; ties by id then resource."""
    ok = [r for r in state.rows() if r["score"] is not None]
    if not ok:
        return None
    top = min(ok, key=lambda r: sort_key(f"{r['trial_id']}@{r['resource']:06d}", r["score"], state.direction))
    return top["trial_id"], top["resource"], top["score"]


def start(state: AshaState, count: int) -> list[TrialRung]:
    new = counter_configs()
    jobs = [state.next_trial_rung(new, True) for _ in range(count)]
    assert all(j is not None and j.rung == 0 and j.checkpoint is None for j in jobs)
    return jobs  # type: ignore[return-value]


def no_new():
    raise AssertionError("new_config must not be called when no new config may start")


# -- (a) the paper's rule on a recorded sequence ---------------------------------------------------------


def test_promotions_follow_top_n_over_eta_in_rung_0() -> None:
    # r=1, R=9, η=3, one bracket s=2: rungs at 1, 3, 9
    state = AshaState.create(1, 9, 3, "max", brackets=[2])
    assert [r.resource for r in state.plan(2).rungs] == [1, 3, 9]
    jobs = start(state, 9)
    ids = dict(zip("abcdefghi", [j.trial_id for j in jobs]))
    name = {v: k for k, v in ids.items()}
    sequence = [  # (trial, score at r=1, trial promoted by next_trial_rung right after, or None)
        ("a", 0.5, None),  # 1 result: ⌊1/3⌋ = 0
        ("b", 0.7, None),  # 2 results: 0
        ("c", 0.6, "b"),  # 3 results: top 1 = b
        ("d", 0.9, "d"),  # 4 results: top 1 = d
        ("e", None, None),  # 5 results: top 1 = d, already promoted; e failed
        ("f", 0.8, "f"),  # 6 results: top 2 = d, f
        ("g", 0.1, None),  # 7: top 2 = d, f
        ("h", None, None),  # 8: top 2 = d, f
        ("i", 0.95, "i"),  # 9: top 3 = i, d, f
    ]
    for trial, score, promoted in sequence:
        state.report(ids[trial], 1, score, None if score is None else f"ck/{trial}@1")
        job = state.next_trial_rung(no_new, False)
        if promoted is None:
            assert job is None, (trial, job)
        else:
            assert job is not None and name[job.trial_id] == promoted
            assert (job.rung, job.resource, job.checkpoint) == (1, 3, f"ck/{promoted}@1")
            assert job.config == jobs["abcdefghi".index(promoted)].config
            assert state.next_trial_rung(no_new, False) is None  # never twice
    assert state.trials[ids["e"]].status == "failed"
    assert sorted(name[t] for t in state.promoted[2][0]) == ["b", "d", "f", "i"]

    # rung 1 (resource 3): b, d, f, i report; top ⌊n/3⌋ go to R = 9
    state.report(ids["b"], 3, 0.75, "ck/b@3")
    assert state.next_trial_rung(no_new, False) is None
    state.report(ids["d"], 3, 0.92, "ck/d@3")
    assert state.next_trial_rung(no_new, False) is None
    state.report(ids["f"], 3, 0.85, "ck/f@3")
    job = state.next_trial_rung(no_new, False)
    assert job is not None and (name[job.trial_id], job.rung, job.resource, job.checkpoint) == ("d", 2, 9, "ck/d@3")
    state.report(ids["i"], 3, 0.97, "ck/i@3")
    job = state.next_trial_rung(no_new, False)
    assert job is not None and (name[job.trial_id], job.resource) == ("i", 9)
    state.report(ids["d"], 9, 0.93, "ck/d@9")
    state.report(ids["i"], 9, 0.96, "ck/i@9")
    assert state.trials[ids["i"]].status == "completed" and state.trials[ids["i"]].resource == 9
    assert state.done()
    assert best(state) == (ids["i"], 3, 0.97)  # best seen at any rung, as the paper returns
    stopped = state.finish()
    assert sorted(name[t] for t in stopped) == ["a", "b", "c", "f", "g"]
    assert Counter(t.status for t in state.trials.values()) == {"stopped": 5, "completed": 2, "failed": 2}


def test_failed_never_promoted_and_ties_by_id_min_direction() -> None:
    state = AshaState.create(1, 9, 3, "min", brackets=[2])
    a, b, c, d, e, f = (j.trial_id for j in start(state, 6))
    state.report(a, 1, None)
    state.report(b, 1, float("nan"))
    state.report(c, 1, None)
    assert state.next_trial_rung(no_new, False) is None  # 3 results, none usable
    state.report(d, 1, 0.2, "ck/d")
    state.report(e, 1, 0.2, "ck/e")
    state.report(f, 1, 0.3, "ck/f")
    # 6 results: top 2 by loss (failed last) = d, e (tie at 0.2 broken by id)
    assert [state.next_trial_rung(no_new, False).trial_id for _ in range(2)] == [d, e]  # type: ignore[union-attr]
    assert state.next_trial_rung(no_new, False) is None
    assert state.trials[b].status == "failed" and state.rungs[2][0][b] is None


# -- (b) highest rung first -----------------------------------------------------------------------------


def test_highest_rung_first_within_a_bracket() -> None:
    state = AshaState.create(1, 27, 3, "max", brackets=[3])  # rungs 1, 3, 9, 27
    jobs = start(state, 12)
    ids = [j.trial_id for j in jobs]
    for i, t in enumerate(ids[:9]):
        state.report(t, 1, float(i), f"ck/{t}")
    # 9 results in rung 0: top 3 = ids[8], ids[7], ids[6]
    up = [state.next_trial_rung(no_new, False) for _ in range(3)]
    assert [j.trial_id for j in up] == [ids[8], ids[7], ids[6]]  # type: ignore[union-attr]
    for j in up:
        state.report(j.trial_id, 3, 10.0 + float(j.trial_id[-2:]), f"ck/{j.trial_id}@3")  # type: ignore[union-attr]
    # rung 1 has 3 results (top 1 = ids[8]); rung 0 gets three more so that ids[11] is promotable too
    for i, t in enumerate(ids[9:12]):
        state.report(t, 1, 100.0 + i, f"ck/{t}")
    first = state.next_trial_rung(no_new, False)
    assert first is not None and (first.trial_id, first.rung, first.resource) == (ids[8], 2, 9)
    second = state.next_trial_rung(no_new, False)
    assert second is not None and (second.trial_id, second.rung) == (ids[11], 1)
    # top 4 of rung 0's 12 results: ids[11], ids[10], ids[9], ids[8]; two are left, best first
    assert state.promotable() == [(3, 0, ids[10]), (3, 0, ids[9])]


def test_across_brackets_highest_resource_then_larger_s() -> None:
    state = AshaState.create(1, 9, 3, "max", brackets=[2, 1])  # s=2: 1, 3, 9; s=1: 3, 9
    new = counter_configs()
    jobs = [state.next_trial_rung(new, True) for _ in range(20)]
    by_s = {s: [j.trial_id for j in jobs if j.bracket == s] for s in (2, 1)}  # type: ignore[union-attr]
    assert len(by_s[2]) >= 9 and len(by_s[1]) >= 3
    for i, t in enumerate(by_s[2][:3]):
        state.report(t, 1, float(i), f"ck/{t}")
    for i, t in enumerate(by_s[1][:3]):
        state.report(t, 3, float(i), f"ck/{t}")
    # s=2 promotes to 3, s=1 promotes to 9: the one going to the higher resource first
    order = [(j.bracket, j.rung, j.resource) for j in (state.next_trial_rung(no_new, False), state.next_trial_rung(no_new, False))]  # type: ignore[union-attr]
    assert order == [(1, 1, 9), (2, 1, 3)]


def test_same_target_resource_prefers_larger_s() -> None:
    state = AshaState.create(1, 9, 3, "max", brackets=[2, 1])
    new = counter_configs()
    jobs = [state.next_trial_rung(new, True) for _ in range(30)]
    by_s = {s: [j.trial_id for j in jobs if j.bracket == s] for s in (2, 1)}  # type: ignore[union-attr]
    # s=2: nine at rung 0, promote three to rung 1 (resource 3), all report there
    for i, t in enumerate(by_s[2][:9]):
        state.report(t, 1, float(i), f"ck/{t}")
    up = [state.next_trial_rung(no_new, False) for _ in range(3)]
    assert all(j is not None and j.bracket == 2 and j.resource == 3 for j in up)
    for j in up:
        state.report(j.trial_id, 3, 1.0, f"ck/{j.trial_id}@3")  # type: ignore[union-attr]
    # s=1: three at rung 0 (resource 3)
    for i, t in enumerate(by_s[1][:3]):
        state.report(t, 3, float(i), f"ck/{t}")
    # both brackets now have a promotion to R = 9
    assert sorted({(s, state.plan(s).rungs[k + 1].resource) for s, k, _ in state.promotable()}) == [(1, 9), (2, 9)]
    first, second = state.next_trial_rung(no_new, False), state.next_trial_rung(no_new, False)
    assert (first.bracket, first.rung, first.resource) == (2, 2, 9)  # type: ignore[union-attr]
    assert (second.bracket, second.rung, second.resource) == (1, 1, 9)  # type: ignore[union-attr]


# -- (c) bracket shares --------------------------------------------------------------------------------


@pytest.mark.parametrize("r,R,eta", [(1, 27, 3), (1, 81, 3), (1, 100, 4), (2, 50, 2)])
def test_new_configs_split_in_hyperband_proportions(r: int, R: int, eta: int) -> None:
    plan = brackets(r, R, eta)
    n = {b.s: b.n_configs for b in plan}
    total = sum(n.values())
    state = AshaState.create(r, R, eta)
    new = counter_configs()
    seen: Counter[int] = Counter()
    for t in range(1, 2 * total + 1):
        job = state.next_trial_rung(new, True)
        assert job is not None and job.rung == 0 and job.resource == state.plan(job.bracket).rungs[0].resource
        seen[job.bracket] += 1
        for s in n:  # lower quota at every prefix: never behind its share by a whole config
            assert seen[s] >= (t * n[s]) // total
        if t % total == 0:
            assert dict(seen) == {s: n[s] * t // total for s in n}
    assert state.configs_started == 2 * total


def test_bracket_shares_27_12_6_4() -> None:
    state = AshaState.create(1, 27, 3)
    new = counter_configs()
    shares = Counter(state.next_trial_rung(new, True).bracket for _ in range(49))  # type: ignore[union-attr]
    assert [shares[s] for s in (3, 2, 1, 0)] == [27, 12, 6, 4]
    assert state.started == {3: 27, 2: 12, 1: 6, 0: 4}
    # D'Hondt: 9 quotients n_s/(c+1) exceed 4 (27/1..27/6, 12/1, 12/2, 6/1); 12/3 = 4/1 ties and goes to s=2,
    # so bracket s=0 gets its first config 11th
    assert state.trials["s0-0000"].config == {"n": 10}


# -- simulation helpers ----------------------------------------------------------------------------------


def score(config: dict, resource: int) -> float | None:
    x, y = config["x"], config["y"]
    if y == 9 and resource > 1:
        return None  # a deterministic failure
    return -((x - 0.4) ** 2) - 0.01 * y + 0.1 * (1 - 1 / resource) * x


def simulate(state: AshaState, rng: np.random.Generator, n_configs: int, workers: int, steps: int | None = None,
             queue: deque | None = None) -> tuple[list[tuple], deque]:
    """Up to ``workers`` trial-rungs in flight; the oldest reports first. Returns the jobs handed out."""
    queue = deque() if queue is None else queue
    log: list[tuple] = []
    step = 0
    while steps is None or step < steps:
        while len(queue) < workers:
            job = state.next_trial_rung(lambda: SPACE.sample(rng), state.configs_started < n_configs)
            if job is None:
                break
            log.append((job.trial_id, job.bracket, job.rung, job.resource, json.dumps(job.config), job.checkpoint))
            queue.append(job)
        if not queue:
            break
        job = queue.popleft()
        state.report(job.trial_id, job.resource, score(job.config, job.resource), f"ck/{job.trial_id}@{job.resource}")
        step += 1
    return log, queue


# -- (d) resume --------------------------------------------------------------------------------------


def test_json_round_trip_mid_run_gives_identical_next_jobs() -> None:
    state = AshaState.create(1, 27, 3, "max")
    rng = np.random.default_rng(3)
    _, queue = simulate(state, rng, n_configs=80, workers=4, steps=60)
    assert queue and sorted(state.in_flight()) == sorted(j.trial_id for j in queue)
    resumed = AshaState.from_json(json.loads(json.dumps(state.to_json())))
    assert resumed == state and resumed.to_json() == state.to_json()
    log_resumed, _ = simulate(resumed, copy.deepcopy(rng), n_configs=80, workers=4, queue=copy.deepcopy(queue))
    log, _ = simulate(state, rng, n_configs=80, workers=4, queue=queue)
    assert log and log == log_resumed
    assert resumed.to_json() == state.to_json()
    assert state.done() and state.configs_started == 80


def test_round_trip_preserves_promoted_sets_and_next_job() -> None:
    state = AshaState.create(1, 9, 3, "max", brackets=[2])
    jobs = start(state, 6)
    for i, j in enumerate(jobs):
        state.report(j.trial_id, 1, float(i), f"ck/{j.trial_id}")
    first = state.next_trial_rung(no_new, False)
    copy_ = AshaState.from_json(json.loads(json.dumps(state.to_json())))
    assert copy_.promoted[2][0] == {first.trial_id}  # type: ignore[union-attr]
    assert copy_.next_trial_rung(no_new, False) == state.next_trial_rung(no_new, False) == TrialRung(
        jobs[4].trial_id, 2, 1, 3, jobs[4].config, f"ck/{jobs[4].trial_id}"
    )


# -- (e) determinism -----------------------------------------------------------------------------------


def run(seed: int) -> tuple[list[tuple], dict]:
    state = AshaState.create(1, 27, 3, "max")
    log, queue = simulate(state, np.random.default_rng(seed), n_configs=60, workers=3)
    assert not queue and state.done()
    state.finish()
    return log, state.to_json()


def test_deterministic_under_a_seed() -> None:
    log_a, state_a = run(11)
    log_b, state_b = run(11)
    assert log_a == log_b and state_a == state_b
    log_c, _ = run(12)
    assert log_c != log_a
    statuses = Counter(t["status"] for t in state_a["trials"].values())
    assert set(statuses) <= {"stopped", "completed", "failed"} and statuses["completed"] >= 1
    assert sum(statuses.values()) == 60
    # every result at R belongs to a completed (or failed) trial, and every promotion followed the rule
    state = AshaState.from_json(state_a)
    for s in state.brackets:
        for k in range(len(state.plan(s).rungs) - 1):
            up = state.promoted[s][k]
            assert up == set(state.rungs[s][k + 1])
            assert all(state.rungs[s][k][t] is not None for t in up)


# -- errors ----------------------------------------------------------------------------------------------


def test_report_and_create_errors() -> None:
    state = AshaState.create(1, 9, 3, "max", brackets=[2])
    (job,) = start(state, 1)
    with pytest.raises(ValueError, match="unknown trial 'nope'"):
        state.report("nope", 1, 0.5)
    with pytest.raises(ValueError, match="got resource 3"):
        state.report(job.trial_id, 3, 0.5)
    state.report(job.trial_id, 1, 0.5, "ck")
    with pytest.raises(ValueError, match="no trial-rung in flight"):
        state.report(job.trial_id, 1, 0.5)
    with pytest.raises(ValueError, match="s=5"):
        AshaState.create(1, 9, 3, brackets=[5])
    with pytest.raises(ValueError, match="direction"):
        AshaState.create(1, 9, 3, "up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eta"):
        AshaState.create(1, 9, 1)
    with pytest.raises(ValueError, match="mapping"):
        state.next_trial_rung(lambda: [1, 2], True)  # type: ignore[arg-type, return-value]
    (other,) = start(state, 1)
    with pytest.raises(ValueError, match="in flight"):
        state.finish()
    state.report(other.trial_id, 1, None, error="boom")
    assert state.trials[other.trial_id].error == "boom"
    assert state.rows()[-1] == {"trial_id": other.trial_id, "bracket": 2, "rung": 0, "resource": 1, "score": None}


# -- end to end with the synthetic trainer -------------------------------------------------------------


def test_asha_with_synthetic_trainer_and_tpe(tmp_path) -> None:
    from prefect_hyperband.hyperband.sampler import TPESampler
    from prefect_hyperband.trainers.synthetic_trainer import DEFAULT_CONFIG, DEFAULT_SPACE, SyntheticTrainer

    trainer = SyntheticTrainer(seed=0, fail_rate=0.1)
    sampler = TPESampler(parse(DEFAULT_SPACE), 0, trainer.direction)
    state = AshaState.create(1, 27, 3, trainer.direction)
    queue: deque[TrialRung] = deque()
    while True:
        while len(queue) < 4:
            job = state.next_trial_rung(sampler.ask, state.configs_started < 60)
            if job is None:
                break
            queue.append(job)
        if not queue:
            break
        job = queue.popleft()
        out = str(tmp_path / f"{job.trial_id}@{job.resource}")
        try:
            result = trainer.train(job.config, job.resource, job.checkpoint, out)
        except RuntimeError as exc:
            state.report(job.trial_id, job.resource, None, error=str(exc))
            sampler.tell(job.config, job.resource, None)
            continue
        assert result.resource_trained == job.resource - (state.trials[job.trial_id].resource)
        value = trainer.evaluate(result.checkpoint)
        state.report(job.trial_id, job.resource, value, result.checkpoint)
        sampler.tell(job.config, job.resource, value)
    state.finish()
    trial_id, resource, value = best(state)  # type: ignore[misc]
    assert value < trainer.curve(DEFAULT_CONFIG, 27)
    statuses = Counter(t.status for t in state.trials.values())
    assert statuses["failed"] >= 1 and statuses["completed"] >= 4 and sum(statuses.values()) == 60
    used = sum(r["resource"] - (state.plan(r["bracket"]).rungs[r["rung"] - 1].resource if r["rung"] else 0)
               for r in state.rows())
    assert used < 60 * 27 / 2  # early stopping: far less than every config to R
