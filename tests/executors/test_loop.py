"""The job's loop on fakes: a simulated executor and clock (trial-rungs take simulated seconds, waiting moves
the time), a recording tracker and stop token. No threads, no sleeps, no Prefect, no MLflow: milliseconds."""

from __future__ import annotations

import heapq
import itertools
import json
from concurrent.futures import Future

import pytest

from prefect_hyperband.executors.loop import ORCHESTRATION_RETRIES, POLL, JobStopped, Loop, Outcome
from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.first import BASELINE_BRACKET, BASELINE_TRIAL, Firsts
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.trainers.base import Evaluation, TrainResult

SPACE = parse({"x": {"type": "float", "low": 0.0, "high": 1.0}})
HANG = float("inf")


def score(trial_rung: TrialRung) -> float:
    """Lower is better; improves with resource."""
    return trial_rung.config["x"] + 1.0 / trial_rung.resource


def trained(trial_rung: TrialRung, seconds: float) -> Outcome:
    done = TrainResult(f"ck/{trial_rung.trial_id}/{trial_rung.resource}", trial_rung.resource,
                       trial_rung.resource - (0 if trial_rung.checkpoint is None else int(trial_rung.checkpoint.rsplit("/", 1)[1])),
                       seconds, 1)
    return Outcome(trial_rung, done, Evaluation(score(trial_rung), 0.0), None)


class Sim:
    """The loop's Executor and Clock in one. ``behave(trial_rung, attempt)`` gives (seconds, Outcome or Exception)."""

    def __init__(self, behave=None) -> None:
        self.behave = behave or (lambda trial_rung, attempt: (float(trial_rung.resource), trained(trial_rung, float(trial_rung.resource))))
        self.t = 0.0
        self.queue: list = []
        self.seq = itertools.count()
        self.began_at: dict[Future, float] = {}
        self.submitted: list[TrialRung] = []
        self.given_up: list[TrialRung] = []
        self.flying = self.most = self.interrupted = 0
        self.on_submit = lambda trial_rung: None

    # -- Clock
    def now(self) -> float:
        return self.t

    def wait(self, futures, timeout):
        futures = list(futures)
        if not any(f.done() for f in futures):
            due = [at for at, _, f, _, _ in self.queue if f in futures]
            self.t = min([self.t + timeout, *due])
            while self.queue and self.queue[0][0] <= self.t:
                _, _, future, result, _ = heapq.heappop(self.queue)
                self.flying -= 1
                future.set_exception(result) if isinstance(result, Exception) else future.set_result(result)
        return {f for f in futures if f.done()}

    # -- Executor
    def submit(self, trial_rung: TrialRung) -> Future:
        attempt = sum(1 for s in self.submitted if (s.trial_id, s.resource) == (trial_rung.trial_id, trial_rung.resource))
        self.submitted.append(trial_rung)
        self.on_submit(trial_rung)
        future: Future = Future()
        seconds, result = self.behave(trial_rung, attempt)
        self.began_at[future] = self.t
        self.flying += 1
        self.most = max(self.most, self.flying)
        heapq.heappush(self.queue, (self.t + seconds, next(self.seq), future, result, trial_rung))
        return future

    def began(self, future):
        return self.began_at.get(future)

    def give_up(self, future):
        self.given_up.extend(trial_rung for _, _, f, _, trial_rung in self.queue if f is future)

    def interrupt(self):
        self.interrupted += 1

    def shutdown(self, wait):
        self.shut_down_waiting = wait


class Tracker:
    def __init__(self, fail_record=lambda out, n: False) -> None:
        self.started, self.recorded, self.failures, self.closed = [], [], [], []
        self.fail_record = fail_record
        self.drained = False

    def start(self, trial_rung):
        self.started.append(trial_rung.trial_id)

    def record(self, out):
        future: Future = Future()
        if self.fail_record(out, len(self.recorded)):
            future.set_exception(ConnectionError("simulated: the tracking store is down"))
        else:
            self.recorded.append((out.trial_rung.trial_id, out.trial_rung.resource))
            future.set_result(out)
        return future

    def record_failure(self, out):
        self.failures.append((out.trial_rung.trial_id, out.error))
        return out

    def close(self, trial_ids):
        self.closed.extend(trial_ids)

    def drain(self):
        self.drained = True


class Stop:
    def __init__(self) -> None:
        self.on, self.signum, self.reason = False, 0, None

    def requested(self):
        return self.on

    def request(self, signum=2, reason=None):
        self.on, self.signum, self.reason = True, signum, reason


class Watch:
    """The loop's Events, kept."""

    def __init__(self) -> None:
        self.settled_calls, self.warnings = [], []

    def settled(self, out, decisions):
        self.settled_calls.append((out, decisions))

    def warning(self, message):
        self.warnings.append(message)


def hyperband(max_resource=9, seed=0):
    return HyperbandScheduler(1, max_resource, 3, "min", SPACE, seed=seed)


def make(scheduler, sim, tracker=None, stop=None, concurrency=2, saves=None, **kw):
    """A loop over ``sim`` (its executor and clock); each save kept in ``saves`` as the job would write it."""
    tracker = tracker or Tracker()
    saves = [] if saves is None else saves

    def save(rows, elapsed, lost, final=False):
        saves.append({"scheduler": json.loads(json.dumps(scheduler.to_json())), "rows": list(rows),
                      "elapsed": elapsed, "lost": lost, "recorded": list(tracker.recorded)})

    return Loop(scheduler, sim, tracker, sim, stop or Stop(), Watch(), save, concurrency=concurrency, **kw)


def scores(scheduler):
    return {t.trial_id: t.scores for t in scheduler.records()}


class SlowTracker(Tracker):
    """A tracker whose records take ``lag`` simulated seconds (an MLflow writer behind short trainings)."""

    def __init__(self, sim: Sim, lag: float) -> None:
        super().__init__()
        self.sim, self.lag = sim, lag

    def record(self, out):
        future: Future = Future()
        self.recorded.append((out.trial_rung.trial_id, out.trial_rung.resource))
        heapq.heappush(self.sim.queue, (self.sim.t + self.lag, next(self.sim.seq), future, out, out.trial_rung))
        self.sim.flying += 1
        return future


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_slot_trains_while_its_last_result_is_recorded_but_results_lag_the_trainings_by_one_per_slot(concurrency):
    """A tracker ten times slower than the trainings: each slot's next training overlaps its last record, but a slot
    takes no trial-rung while two of its results wait, so the scheduler and the goal decide on results at most one
    trial-rung per slot behind (not the whole schedule behind, as an unbounded queue of records let them)."""
    def one_second(trial_rung, attempt):
        return 1.0, trained(trial_rung, 1.0)

    sim = Sim(one_second)
    sched = hyperband()
    loop = make(sched, sim, SlowTracker(sim, 10.0), concurrency=concurrency)
    behind: list[int] = []  # at each submission: the trial-rungs handed out before it whose result is not settled
    sim.on_submit = lambda trial_rung: behind.append(len(sim.submitted) - 1 - len(loop.rows))
    drive = loop.run()
    assert len(drive.rows) == 22 and sched.done
    assert max(behind) == 2 * concurrency - 1  # the slots' trainings but one, and a record per slot
    fast = make(hyperband(), Sim(one_second), concurrency=concurrency).run()
    key = lambda r: (r["trial_id"], r["resource"], r["score"])  # noqa: E731
    assert sorted(map(key, drive.rows)) == sorted(map(key, fast.rows))


def test_a_synchronous_job_runs_every_trial_rung_once_with_at_most_concurrency_in_flight():
    sim, tracker, saves = Sim(), Tracker(), []
    sched = hyperband()
    drive = make(sched, sim, tracker, concurrency=3, saves=saves).run()
    assert len(drive.rows) == 22 and len(sim.submitted) == 22 and sched.done
    assert sim.most == 3
    assert tracker.recorded == [(r["trial_id"], r["resource"]) for r in drive.rows]  # recorded before it is a row
    for saved in saves:  # every saved row had its tracker write first
        assert {(r["trial_id"], r["resource"]) for r in saved["rows"]} <= set(saved["recorded"])
    assert sorted(tracker.closed) == sorted(scores(sched)) and len(set(tracker.closed)) == 17  # each closed once
    assert tracker.drained and sim.shut_down_waiting
    # a promoted trial resumes its checkpoint: 69 units with resume, the plan's figure
    assert sum(r["resource_trained"] for r in drive.rows) == 69
    assert drive.elapsed == sim.t and drive.lost == 0.0


def test_results_are_told_only_once_saved_and_before_the_next_trial_rungs_are_handed_out():
    sim, sched, happened = Sim(), hyperband(), []
    sim.on_submit = lambda trial_rung: happened.append(("submitted", trial_rung.trial_id, trial_rung.resource))

    class Told(Watch):
        def settled(self, out, decisions):
            happened.append(("told", out.trial_rung.trial_id, out.trial_rung.resource,
                             [d.trial_id for d in decisions if d.kind == "promoted"]))

    def save(rows, elapsed, lost, final=False):
        happened.append(("saved", {(r["trial_id"], r["resource"]) for r in rows}))

    Loop(sched, sim, Tracker(), sim, Stop(), Told(), save, concurrency=3).run()
    saved: set = set()
    told = promotions = 0
    for i, event in enumerate(happened):
        if event[0] == "saved":
            saved = event[1]
        elif event[0] == "told":
            told += 1
            assert (event[1], event[2]) in saved, f"{event} told before it was saved"
            for trial_id in event[3]:  # a promotion is told before the promoted trial's next trial-rung goes out
                assert not [e for e in happened[:i] if e[0] == "submitted" and e[1] == trial_id and e[2] > event[2]]
                assert [e for e in happened[i:] if e[0] == "submitted" and e[1] == trial_id and e[2] > event[2]]
                promotions += 1
    assert told == 22 and promotions == 5


def test_asha_keeps_every_slot_busy_until_max_trials():
    sched = AshaScheduler(AshaState.create(1, 9, 3, "min"), RandomSampler(SPACE, 1), max_trials=20)
    sim = Sim()
    drive = make(sched, sim, concurrency=4).run()
    assert sched.state.configs_started == 20 and sched.done
    assert all(t.status in ("stopped", "completed") for t in sched.records())
    assert sim.most == 4 and len(drive.rows) == len(sim.submitted)


PRIORS = parse({"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.2, "confidence": "high"}})


def priorband(max_resource=9, seed=0):
    """Brackets in turn, each sampling from PriorBand's policy over what the earlier ones taught it."""
    sampler = PriorBandSampler(PRIORS, seed, "min", 1, max_resource, 3)
    return HyperbandScheduler(1, max_resource, 3, "min", PRIORS, seed=seed, sampler=sampler, sequential=True)


def prior_first(max_resource=9, seed=0):
    """PriorBand after the priors' mode trained straight to R (``--prior-first``)."""
    sched = priorband(max_resource, seed)
    sched.first = Firsts.of(None, priors.mode(PRIORS), max_resource)
    return sched


def reload(saved):
    if saved.get("sampler"):
        inner = HyperbandScheduler.from_json(saved, PRIORS, PriorBandSampler.from_json(PRIORS, saved["sampler"]))
    else:
        inner = HyperbandScheduler.from_json(saved, SPACE, None)
    return inner


@pytest.mark.parametrize("hyperband", [hyperband, priorband, prior_first], ids=["random", "priorband", "prior-first"])
def test_a_stop_ends_the_loop_saved_and_a_resume_reaches_the_uninterrupted_result(hyperband):
    whole = hyperband(27, seed=3)
    make(whole, Sim()).run()

    sim, stop, saves = Sim(), Stop(), []
    sim.on_submit = lambda trial_rung: stop.request(15) if len(sim.submitted) == 20 else None
    cut = hyperband(27, seed=3)
    with pytest.raises(JobStopped) as stopped:
        make(cut, sim, stop=stop, saves=saves).run()
    assert stopped.value.signum == 15 and sim.interrupted == 1
    assert len(sim.submitted) == 20  # nothing new after the stop
    last = saves[-1]
    assert 0 < len(last["rows"]) <= 20  # the results of those in flight are kept when their training ended well
    resumed = reload(last["scheduler"])
    rest = Sim()
    drive = make(resumed, rest, rows=list(last["rows"]), spent=last["elapsed"]).run()
    assert scores(resumed) == scores(whole)
    kept = {(r["trial_id"], r["resource"]) for r in last["rows"]}
    assert not kept & {(t.trial_id, t.resource) for t in rest.submitted}  # kept results are not trained again
    assert len(drive.rows) == sum(len(s) for s in scores(whole).values())


def test_a_stop_for_a_reason_names_it():
    sim, stop = Sim(), Stop()
    sim.on_submit = lambda trial_rung: stop.request(0, "the Dask scheduler at tcp://head:8786 is unreachable") \
        if len(sim.submitted) == 5 else None
    with pytest.raises(JobStopped, match=r"^stopped: the Dask scheduler at tcp://head:8786 is unreachable$"):
        make(hyperband(9, seed=1), sim, stop=stop).run()


def test_a_full_disk_under_the_tracking_store_stops_the_job_instead_of_failing_trials():
    """SQLite's "database or disk is full" from the tracker: not the trial's failure nor a retry; the job stops
    and names it, the trial-rung is not a row (--resume trains it)."""
    import sqlite3

    def behave(trial_rung, attempt):
        if trial_rung.trial_id == "s2-0002":
            return 1.0, sqlite3.OperationalError("database or disk is full")
        return 1.0, trained(trial_rung, 1.0)

    sim, tracker, sched = Sim(behave), Tracker(), hyperband()
    with pytest.raises(JobStopped, match=r"^stopped: no space left on device \(OperationalError: database or disk"):
        make(sched, sim, tracker, concurrency=1).run()
    assert [t for t in sim.submitted if t.trial_id == "s2-0002"] and not tracker.failures
    assert "failed" not in {t.status for t in sched.records()}


def test_a_stop_gives_the_trainings_in_flight_their_grace_then_abandons_them():
    def behave(trial_rung, attempt):
        return (HANG, None) if trial_rung.trial_id == "s1-0000" else (1.0, trained(trial_rung, 1.0))

    sim, stop = Sim(behave), Stop()
    sim.on_submit = lambda trial_rung: stop.request() if len(sim.submitted) == 4 else None
    with pytest.raises(JobStopped) as stopped:
        make(hyperband(3), sim, stop=stop, concurrency=4, grace=8.0).run()
    assert stopped.value.abandoned == 1
    assert 8.0 < sim.t <= 8.0 + 2 * POLL  # the grace, from the pass that saw the stop, on the loop's clock
    assert sim.shut_down_waiting is False


def test_the_stops_grace_is_8_s_unless_the_environment_sets_another(monkeypatch):
    from prefect_hyperband.executors.loop import stop_grace

    monkeypatch.delenv("HYPERBAND_STOP_GRACE", raising=False)
    assert stop_grace() == 8.0
    monkeypatch.setenv("HYPERBAND_STOP_GRACE", "120")
    assert stop_grace() == 120.0


def test_a_trial_rung_past_its_timeout_fails_its_trial_and_the_job_goes_on():
    def behave(trial_rung, attempt):
        return (HANG, None) if trial_rung.trial_id == "s2-0004" else (1.0, trained(trial_rung, 1.0))

    sim, tracker = Sim(behave), Tracker()
    sched = hyperband()
    drive = make(sched, sim, tracker, concurrency=2, trial_timeout=30.0).run()
    assert [t.trial_id for t in sim.given_up] == ["s2-0004"]
    failed = {t.trial_id: t for t in sched.records() if t.status == "failed"}
    assert list(failed) == ["s2-0004"] and "--trial-timeout" in failed["s2-0004"].error
    assert tracker.failures and tracker.failures[0][0] == "s2-0004"
    assert sched.done and len(drive.rows) == 22  # its trial-rung is a row (failed); its rung still promotes 3
    assert 30.0 < drive.lost <= 30.25  # the given-up training's seconds, on the loop's clock


def test_a_trial_rung_handed_out_with_a_shorter_timeout_than_those_in_flight_is_given_up_at_its_own():
    """The job's measured timeout (``Timeouts``: an hour until three trial-rungs are measured, then at least 300 s)
    shrinks while earlier trial-rungs still fly with the hour: a later one that hangs is given up at its 300 s."""
    handed = itertools.count()
    hung: list[str] = []

    def behave(trial_rung, attempt):
        if next(handed) == 7:
            hung.append(trial_rung.trial_id)
            return HANG, None
        return 1.0, trained(trial_rung, 1.0)

    sim = Sim(behave)
    drive = make(hyperband(), sim, concurrency=2).run()
    assert [t.trial_id for t in sim.given_up] == hung
    assert 300.0 < drive.lost <= 300.25


def test_an_orchestration_error_runs_the_trial_rung_again_and_past_its_retries_fails_the_trial():
    def behave(trial_rung, attempt):
        if trial_rung.trial_id == "s2-0000" and attempt < ORCHESTRATION_RETRIES:
            return 1.0, RuntimeError("simulated: Prefect API answered 503")
        if trial_rung.trial_id == "s1-0000":
            return 1.0, RuntimeError("simulated: API down for this trial")
        return 1.0, trained(trial_rung, 1.0)

    sim, tracker, sched = Sim(behave), Tracker(), hyperband()
    make(sched, sim, tracker, concurrency=1).run()
    status = {t.trial_id: t.status for t in sched.records()}
    assert status["s2-0000"] != "failed"  # retried twice, then trained
    assert sum(1 for t in sim.submitted if t.trial_id == "s2-0000" and t.resource == 1) == ORCHESTRATION_RETRIES + 1
    assert status["s1-0000"] == "failed" and tracker.failures == [("s1-0000", "RuntimeError: simulated: API down for this trial")]
    assert sum(1 for t in sim.submitted if t.trial_id == "s1-0000") == ORCHESTRATION_RETRIES + 1


def test_a_remote_trial_rung_lost_with_a_workers_connection_error_runs_again_and_does_not_stop_the_job():
    """A task worker's run ended Failed while the Prefect API was away ("Connection refused" in its message): the
    job's own API answers again, so the trial-rung runs again, as any lost remote run; the job is not stopped."""
    class Lost(RuntimeError):
        run_again = True  # flows.work_pool.TrialRunLost's

    def behave(trial_rung, attempt):
        if trial_rung.trial_id == "s2-0001" and attempt == 0:
            return 1.0, Lost("task run 7c7c ended FAILED: Task run encountered an exception ConnectError: [Errno 111] "
                             "Connection refused")
        return 1.0, trained(trial_rung, 1.0)

    sim, tracker, sched = Sim(behave), Tracker(), hyperband()
    drive = make(sched, sim, tracker, concurrency=2).run()
    assert sched.done and len(drive.rows) == 22 and not tracker.failures
    assert sum(1 for t in sim.submitted if (t.trial_id, t.resource) == ("s2-0001", 1)) == 2


def test_a_tracking_store_down_past_its_retries_stops_the_job_not_the_trial():
    """Its client retried for minutes (MLflow's), then the writer (1, 5, 15 s): the job stops and names it (exit 75,
    --resume goes on); the trial-rung is not a row and no trial failed."""
    def fail_record(out, n):
        return out.trial_rung.trial_id == "s2-0003"

    sim, tracker, sched = Sim(), Tracker(fail_record), hyperband()
    with pytest.raises(JobStopped, match=r"^stopped: a server did not answer past its retries \(ConnectionError: "
                                         r"simulated: the tracking store is down\)$"):
        make(sched, sim, tracker).run()
    assert not tracker.failures and "failed" not in {t.status for t in sched.records()}
    assert sum(1 for t in sim.submitted if (t.trial_id, t.resource) == ("s2-0003", 1)) == 1


def test_a_trainer_error_fails_its_trial_which_is_closed_and_never_promoted():
    def behave(trial_rung, attempt):
        if trial_rung.trial_id == "s2-0001":
            return 1.0, Outcome(trial_rung, None, None, "ValueError: diverged")
        return 1.0, trained(trial_rung, 1.0)

    sim, tracker, sched = Sim(behave), Tracker(), hyperband()
    drive = make(sched, sim, tracker).run()
    assert [r["score"] for r in drive.rows if r["trial_id"] == "s2-0001"] == [None]
    assert ("s2-0001", 1) in tracker.recorded and tracker.closed.count("s2-0001") == 1
    assert {t.trial_id for t in sim.submitted if t.resource > 1}.isdisjoint({"s2-0001"})
    assert drive.lost == 1.0  # the second it took left no result: lost worker-seconds


def test_the_baseline_is_a_trial_rung_of_the_scheduler_in_a_slot_and_its_row_comes_back_apart():
    sim, saves = Sim(), []
    sched = hyperband()
    sched.first = Firsts.of({"x": 0.25}, None, 9)
    drive = make(sched, sim, concurrency=2, saves=saves).run()
    first = sim.submitted[0]
    assert (first.trial_id, first.bracket, first.resource, first.config) == (BASELINE_TRIAL, BASELINE_BRACKET, 9, {"x": 0.25})
    assert sim.most == 2 and sched.done  # it took one of the two slots; the schedule ran to its end beside it
    assert len(drive.rows) == 22 and all(r["trial_id"] != BASELINE_TRIAL for r in drive.rows)
    assert drive.baseline["score"] == drive.default_score == pytest.approx(0.25 + 1 / 9)
    assert drive.baseline["train_seconds"] == 9.0  # its cost, for the summary
    assert BASELINE_TRIAL not in scores(sched)  # not a trial of the search
    assert saves[-1]["scheduler"]["baseline"]["status"] == "completed"  # saved: a resume does not train it again


def test_a_failed_baseline_leaves_no_default_score_and_the_job_goes_on():
    def behave(trial_rung, attempt):
        if trial_rung.trial_id == BASELINE_TRIAL:
            return 2.0, Outcome(trial_rung, None, None, "ValueError: no default")
        return float(trial_rung.resource), trained(trial_rung, float(trial_rung.resource))

    sched = hyperband()
    sched.first = Firsts.of({"x": 0.25}, None, 9)
    drive = make(sched, Sim(behave)).run()
    assert drive.default_score is None and drive.baseline["score"] is None and len(drive.rows) == 22 and sched.done


def test_the_same_seed_gives_the_same_rows_whatever_the_concurrency():
    one = make(hyperband(27, seed=5), Sim(), concurrency=1).run()
    many = make(hyperband(27, seed=5), Sim(), concurrency=7).run()
    key = lambda r: (r["trial_id"], r["resource"], r["score"])  # noqa: E731
    assert sorted(map(key, one.rows)) == sorted(map(key, many.rows))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_write_that_waits_is_said_once_and_its_answer_once():
    """MLflow answering 503 (its client retries silently for minutes): one line when a write has waited, one when
    writes go through again; the writes themselves are not touched."""
    from concurrent.futures import Future

    from prefect_hyperband.tracking.tracker import _Waiting

    said, clock = [], _Clock()
    waiting = _Waiting("http://mlflow:5000", said.append, clock=clock, watching=False)
    slow, slower = waiting.watch(Future()), waiting.watch(Future())
    clock.now += 9
    waiting.check()
    assert said == []
    clock.now += 1
    for _ in range(3):  # said once, however long it waits, however many writes wait
        waiting.check()
        clock.now += 30
    slow.set_result("run-1")
    slower.set_result("run-2")
    assert said[0].startswith("MLflow at http://mlflow:5000 has not answered for 10 s; the job waits for it")
    assert len(said) == 2 and said[1] == "MLflow at http://mlflow:5000 answers again after 100 s"


def test_the_backlog_of_an_outage_that_ended_is_not_said_again():
    """Writes queued during an outage are older than the warning's bound when MLflow answers again: they have
    waited only since that answer, so draining them is not a second outage (CI saw 'answers again after 71 s'
    followed by 'has not answered' at once). A new outage after the answer is said again."""
    from concurrent.futures import Future

    from prefect_hyperband.tracking.tracker import _Waiting

    said, clock = [], _Clock()
    waiting = _Waiting("http://mlflow:5000", said.append, clock=clock, watching=False)
    first = waiting.watch(Future())
    backlog = []
    for _ in range(7):
        clock.now += 10
        backlog.append(waiting.watch(Future()))
        waiting.check()
    assert len(said) == 1
    first.set_result("run-1")  # MLflow answers after 70 s; six queued writes are 10 to 60 s old
    assert said[1] == "MLflow at http://mlflow:5000 answers again after 70 s"
    for future in backlog[:-1]:
        clock.now += 1
        waiting.check()
        future.set_result("ok")
    clock.now += 5
    waiting.check()
    assert len(said) == 2  # the backlog drained without a new "has not answered"
    clock.now += 10  # the last write now waits 10 s past the last answer: a new outage
    waiting.check()
    assert len(said) == 3 and "has not answered for 10 s" in said[2]
    backlog[-1].set_result("ok")
    assert said[3] == "MLflow at http://mlflow:5000 answers again after 15 s"


def test_slots_that_change_while_the_job_runs_are_filled_as_they_come_and_given_back_as_they_go():
    """Task workers coming and going (``Loop.slots``): one slot at first, four once workers join, one again."""
    calls = []

    def slots():
        calls.append(1)
        return 1 if len(calls) < 5 else 4 if len(calls) < 20 else 1

    sim, sched = Sim(), hyperband()
    flying: list[tuple[int, int]] = []  # (the slots' count asked so far, trial-rungs in flight) at each submission
    sim.on_submit = lambda trial_rung: flying.append((len(calls), sim.flying))
    drive = make(sched, sim, concurrency=1, slots=slots).run()
    assert len(drive.rows) == 22 and sched.done
    assert max(n for asked, n in flying if asked < 5) == 0  # one slot: each submitted with none in flight
    assert sim.most == 4  # the slots that joined were used at once
    assert max(n for asked, n in flying if asked >= 21) == 0  # given back: one at a time again


def test_the_loop_asks_the_goal_before_each_trial_rung_journals_every_call_and_leaves_a_met_goals_trials_waiting():
    """The loop writes the scheduler's calls in the journal itself (``hyperband.journal.Journal``) and asks the job's
    goal (``hyperband.criteria.Goal``) before it hands out a trial-rung: once met, none more; those in flight finish
    and report; nothing is finished (the waiting trials stay for a resume with a looser goal)."""
    from prefect_hyperband.hyperband.criteria import Criteria, Goal
    from prefect_hyperband.hyperband.journal import Journal

    sched, journal = hyperband(), Journal()
    sched.first = Firsts.of({"x": 0.25}, None, 9)
    goal = Goal(Criteria(patience=1), "min", 9)
    drive = make(sched, Sim(), concurrency=1, journal=journal, goal=goal).run()
    calls = journal.take()
    handed = [c[1:] for c in calls if c[0] == "job"]
    reported = [c[1:3] for c in calls if c[0] == "report"]
    assert handed == reported and handed[0] == [BASELINE_TRIAL, 9]  # every trial-rung handed out reported, in order
    assert ["finish"] not in calls and not sched.done  # the schedule's waiting trials stay
    assert goal.reason.startswith("patience: 1 results at R=9 in a row")
    assert drive.rows[-1]["resource"] == 9  # one slot: the result at R that met it was the last handed out
    assert len(drive.rows) == len(handed) - 1  # every row but the baseline's (apart)

    whole, journal = hyperband(), Journal()
    make(whole, Sim(), concurrency=2, journal=journal).run()
    calls = journal.take()
    assert calls[-1] == ["finish"] and whole.done and sum(c[0] == "job" for c in calls) == 22
