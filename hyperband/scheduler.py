"""One scheduler interface for synchronous Hyperband and ASHA (Syne Tune's third layer).

A driver keeps its slots busy with ``next_trial_rung()``, hands each result to ``report()``, which
returns what the result decided (``Decision``: trials failed, completed, promoted or stopped, a rung
closed), and stops when ``done``; ``finish()`` ends the trials still waiting. The synchronous rung
barrier lives inside ``HyperbandScheduler``: the result that completes a rung closes it. Both
schedulers speak ids and numbers, hold their sampler, and round-trip through JSON so a killed job
resumes: jobs that were in flight when the state was saved are offered again first.

* ``HyperbandScheduler``: the brackets of ``schedule.brackets(r, R, η)`` side by side (or one
  after another, ``sequential=True``: BOHB's order, each bracket sampling from what the earlier
  ones taught the sampler). Bracket s's configs come from a generator seeded by (seed, s) when
  the sampler is random, so the same seed gives the same configs in any order of execution.
* ``AshaScheduler``: ``asha.AshaState`` with its stopping rules (``max_trials``, a time budget
  measured by a clock passed in).
* Either hands out its first trials before its schedule (``first.Firsts``, ``Schedule``): one config trained
  straight to R (the priors' mode with ``--prior-first``; the default config, the summary's baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, Protocol

from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.hyperband.first import Firsts
from prefect_hyperband.hyperband.priorband import first_rung
from prefect_hyperband.hyperband.promotion import Directions, Score, as_direction, best_key, best_rung, failed
from prefect_hyperband.hyperband.schedule import Bracket
from prefect_hyperband.hyperband.schedule import brackets as schedule_brackets
from prefect_hyperband.hyperband.space import Space
from prefect_hyperband.hyperband.trial import Decision, TrialRecord, TrialRung


class Sampler(Protocol):
    def ask(self) -> dict[str, Any]: ...
    def tell(self, config: Mapping[str, Any], resource: int, score: Score) -> None: ...
    def to_json(self) -> dict[str, Any]: ...


class Scheduler(Protocol):
    def next_trial_rung(self) -> TrialRung | None: ...
    def report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
               error: str | None = None) -> list[Decision]: ...
    def finish(self) -> list[Decision]: ...
    @property
    def done(self) -> bool: ...
    def records(self, ids: Iterable[str] | None = None) -> list[TrialRecord]: ...
    def requeue(self) -> None: ...
    def to_json(self) -> dict[str, Any]: ...


def best_of(records: list[TrialRecord], direction: Directions) -> tuple[TrialRecord, int, Score] | None:
    """The best (trial, resource, score) seen at any rung, as the paper returns; ranked by ``promotion.sort_key``
    (of several objectives: by the first)."""
    seen = [(t, r, v) for t in records for r, v in t.scores.items() if v is not None]
    if not seen:
        return None
    return min(seen, key=lambda c: best_key(c[0].trial_id, c[1], c[2], direction))


def trial_bests(records: list[TrialRecord], direction: Directions) -> dict[str, tuple[int, float]]:
    """Each trial's best (resource, value) over its rungs (``promotion.best_rung``): a resumed job's runs'
    ``best_<metric>`` so far."""
    found = {t.trial_id: best_rung(t.trial_id, t.scores, direction) for t in records}
    return {t: b for t, b in found.items() if b is not None}


# --------------------------------------------------------------------------------- synchronous


class Schedule:
    """What both schedulers do around their own schedule: their first trials (``first.Firsts``: the baseline, the
    priors' mode) handed out before it, reported, recorded and saved beside it. A scheduler defines ``_next``,
    ``_report``, ``_finish``, ``_done``, ``_records``, ``_requeue`` and ``_json``; ``first`` is its field."""

    first: Firsts

    def next_trial_rung(self) -> TrialRung | None:
        return self.first.next_trial_rung() or self._next()

    def report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
               error: str | None = None) -> list[Decision]:
        trial = self.first.find(trial_id)
        if trial is not None:
            return trial.report(resource, score, checkpoint, error)
        return self._report(trial_id, resource, score, checkpoint, error)

    def finish(self) -> list[Decision]:
        if self.first.running():
            raise ValueError(f"cannot finish with trial-rungs in flight: report {', '.join(self.first.running())} first")
        return self._finish()

    @property
    def done(self) -> bool:
        return self.first.done and self._done()

    def records(self, ids: Iterable[str] | None = None) -> list[TrialRecord]:
        """Every trial's record, or those of ``ids`` (in that order)."""
        return self.first.records(ids, self._records)

    def requeue(self) -> None:
        """The trial-rungs in flight (a loaded state's) are pending again: offered first."""
        self.first.requeue()
        self._requeue()

    def to_json(self) -> dict[str, Any]:
        return {**self._json(), **self.first.to_json()}

    # what each scheduler defines
    def _next(self) -> TrialRung | None: ...
    def _report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
                error: str | None) -> list[Decision]: ...
    def _finish(self) -> list[Decision]: ...
    def _done(self) -> bool: ...
    def _records(self, ids: Iterable[str] | None) -> list[TrialRecord]: ...
    def _requeue(self) -> None: ...
    def _json(self) -> dict[str, Any]: ...


@dataclass
class HyperbandScheduler(Schedule):
    """Synchronous successive halving in every bracket of the (r, R, η) schedule (Li et al., JMLR 2018)."""

    min_resource: int
    max_resource: int
    eta: int
    direction: Directions
    space: Space
    seed: int
    sampler: Sampler | None = None  # None: each bracket draws from its own (seed, s) generator
    sequential: bool = False
    states: dict[int, BracketState] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    #: in turn, the narrowest bracket first (s = 0: configs straight to R): what a warm start did before 2026-11-28
    #: (its states resume so) and ``benchmarks/bench_transfer.py --warm-order narrowest`` compares
    narrow_first: bool = False
    first: Firsts = field(default_factory=Firsts)  # the baseline, the priors' mode: before the brackets
    _plan: list[Bracket] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._plan = list(schedule_brackets(self.min_resource, self.max_resource, self.eta))
        if self.narrow_first:
            self._plan.reverse()
        if not self.states and not self.sequential:
            for b in self._plan:
                self._start(b)

    def _requeue(self) -> None:
        self.in_flight = set()

    def _start(self, b: Bracket) -> BracketState:
        ask = None  # a sampler draws every bracket's configs (a warm start's first ones too; in turn: BOHB)
        if self.sampler is not None:
            ask = _asker(self.sampler, first_rung(self.min_resource, self.max_resource, self.eta, b.s))
        state = BracketState.start(b, self.eta, self.space, self.seed, self.direction, ask)
        self.states[b.s] = state
        return state

    def _open(self) -> list[BracketState]:
        """Brackets that may run now: all side by side, or the first unfinished one (starting it) in sequence."""
        if not self.sequential:
            return [self.states[b.s] for b in self._plan]
        for b in self._plan:
            state = self.states.get(b.s) or self._start(b)
            if not state.done:
                return [state]
        return []

    def _next(self) -> TrialRung | None:
        for state in self._open():
            for t in state.pending():
                if t not in self.in_flight:
                    self.in_flight.add(t)
                    trial = state.trials[t]
                    return TrialRung(t, state.s, state.rung_index, state.current.resource, dict(trial.config), trial.checkpoint)
        return None

    def _report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
                error: str | None) -> list[Decision]:
        """Record a result; the one that completes its rung closes it (the top ⌊n_i/η⌋ go up, the rest stop)."""
        state = self.states[_bracket_of(trial_id)]
        if trial_id not in self.in_flight:
            raise ValueError(f"trial {trial_id} has no trial-rung in flight; report each once")
        i, rung = state.rung_index, state.current
        state.record(trial_id, resource, score, checkpoint, error)
        self.in_flight.discard(trial_id)
        if self.sampler is not None:
            self.sampler.tell(state.trials[trial_id].config, resource, None if failed(score) else score)
        n = len(state.rungs)
        decisions = [Decision("failed", state.s, i, rung.resource, trial_id, n)] if state.trials[trial_id].status == "failed" else []
        if state.pending():
            return decisions
        before = list(state.active)
        up = state.advance()
        decisions += [Decision("promoted", state.s, i, rung.resource, t, n) for t in up]
        decisions += [Decision(state.trials[t].status, state.s, i, rung.resource, t, n)  # type: ignore[arg-type]
                      for t in before if t not in up and state.trials[t].status in ("stopped", "completed")]
        return decisions + [Decision("rung_closed", state.s, i, rung.resource, None, n)]

    def _finish(self) -> list[Decision]:
        if self.in_flight:
            raise ValueError(f"cannot finish with trial-rungs in flight: report {', '.join(sorted(self.in_flight))} first")
        return []

    def _done(self) -> bool:
        return len(self.states) == len(self._plan) and all(st.done for st in self.states.values())

    def _records(self, ids: Iterable[str] | None) -> list[TrialRecord]:
        trials = ([(self.states[_bracket_of(t)], t) for t in ids] if ids is not None else
                  [(self.states[b.s], t) for b in self._plan if b.s in self.states for t in self.states[b.s].trials])
        return [TrialRecord(t.trial_id, t.bracket, dict(t.config), t.status, t.rung, t.resource, st.scores(i), t.error)
                for st, i in trials for t in (st.trials[i],)]

    def _json(self) -> dict[str, Any]:
        return {
            "kind": "hyperband",
            "min_resource": self.min_resource, "max_resource": self.max_resource, "eta": self.eta,
            "direction": self.direction, "seed": self.seed, "sequential": self.sequential,
            "narrow_first": self.narrow_first,
            "brackets": {str(s): st.to_json() for s, st in self.states.items()},
            "sampler": self.sampler.to_json() if self.sampler is not None else None,
            "in_flight": sorted(self.in_flight),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], space: Space, sampler: Sampler | None,
                  requeue: bool = True) -> HyperbandScheduler:
        """As saved; ``requeue``: its trial-rungs in flight are offered again (else they stay out: a journal's results
        for them follow, ``journal.replay``)."""
        states = {int(s): BracketState.from_json(st) for s, st in raw["brackets"].items()}
        loaded = cls(raw["min_resource"], raw["max_resource"], raw["eta"], as_direction(raw["direction"]), space,
                     raw["seed"], sampler, raw["sequential"], states, set(raw.get("in_flight", ())),
                     raw.get("narrow_first", False), Firsts.from_json(raw, requeue=False))
        if requeue:
            loaded.requeue()
        return loaded


def _asker(sampler: Sampler, rung: int) -> Callable[[], dict[str, Any]]:
    """The sampler's ``ask`` for a bracket whose first rung is ``rung``: a sampler whose draws depend on it
    (PriorBand's ``ask_at``) is told; the others ask as always."""
    ask_at = getattr(sampler, "ask_at", None)
    return (lambda: ask_at(rung)) if ask_at is not None else sampler.ask


def _bracket_of(trial_id: str) -> int:
    """Trial ids are ``s{s}-{j}``."""
    return int(trial_id[1:].split("-", 1)[0])


# --------------------------------------------------------------------------------- asynchronous


@dataclass
class AshaScheduler(Schedule):
    """ASHA (Li et al., MLSys 2020, Algorithm 2) with its stopping rules: ``max_trials`` configs, ``time_budget`` seconds."""

    state: AshaState
    sampler: Sampler
    max_trials: int
    time_budget: float | None = None
    clock: Callable[[], float] = lambda: 0.0  # seconds since the job began, across resumes
    backlog: list[str] = field(default_factory=list)
    first: Firsts = field(default_factory=Firsts)  # the baseline, the priors' mode: before the schedule
    requeued: InitVar[bool] = True  # a loaded state's in-flight jobs go first (False: they stay out, ``requeue``)
    #: False while a journal is replayed: every call it recorded was allowed when it was made
    bounded: bool = field(default=True, repr=False)

    def __post_init__(self, requeued: bool) -> None:
        if requeued:
            self.requeue()

    def _requeue(self) -> None:
        self.backlog = self.state.in_flight()

    def _can_start(self) -> bool:
        if not self.bounded:
            return True
        return self.state.configs_started < self.max_trials and (self.time_budget is None or self.clock() < self.time_budget)

    def _next(self) -> TrialRung | None:
        if self.backlog:
            t = self.state.trials[self.backlog.pop(0)]
            resource = self.state.plan(t.bracket).rungs[t.rung].resource
            return TrialRung(t.trial_id, t.bracket, t.rung, resource, dict(t.config), t.checkpoint)
        st = self.state
        ask = _asker(self.sampler, first_rung(st.min_resource, st.max_resource, st.eta, st.next_bracket()))
        return st.next_trial_rung(ask, self._can_start())

    def _report(self, trial_id: str, resource: int, score: Score, checkpoint: str | None,
                error: str | None) -> list[Decision]:
        """Record a result; ASHA never closes a rung (its promotions happen in ``next_trial_rung``)."""
        self.state.report(trial_id, resource, score, checkpoint if not failed(score) else None, error)
        trial = self.state.trials[trial_id]
        self.sampler.tell(trial.config, resource, None if failed(score) else score)
        if trial.status not in ("failed", "completed"):
            return []
        n = len(self.state.plan(trial.bracket).rungs)
        return [Decision(trial.status, trial.bracket, trial.rung, resource, trial_id, n)]

    def _finish(self) -> list[Decision]:
        """The trials still waiting in a rung are stopped there."""
        stopped = self.state.finish()
        plan = self.state.plan
        return [Decision("stopped", (t := self.state.trials[i]).bracket, t.rung, t.resource, i, len(plan(t.bracket).rungs))
                for i in stopped]

    def _done(self) -> bool:
        return not self.backlog and self.state.done(self._can_start())

    def _records(self, ids: Iterable[str] | None) -> list[TrialRecord]:
        """A few trials cost a few lookups."""
        st = self.state
        trials = [st.trials[t] for t in ids] if ids is not None else list(st.trials.values())
        return [TrialRecord(t.trial_id, t.bracket, dict(t.config), t.status, t.rung, t.resource, st.scores(t.trial_id),
                            t.error) for t in trials]

    def _json(self) -> dict[str, Any]:
        return {"kind": "asha", "state": self.state.to_json(), "sampler": self.sampler.to_json(),
                "max_trials": self.max_trials, "time_budget": self.time_budget}
