"""Trial-rungs grouped into subflow runs of the job's flow run, so that every page of the Prefect UI stays usable.

A job is one flow run; each trial-rung is two task runs (``train``, ``evaluate``). Left flat, a 10,000-trial-rung job
is 20,000 task runs under one flow run, and Prefect's run graph hides itself above 2,000 nodes ("large graphs are
hidden by default"). So trial-rungs run inside ``hyperband-group`` subflow runs, the design card's DAG per bracket:

- **Hyperband** (synchronous brackets): one subflow run per bracket, ``bracket s=2``, holding its trial-rungs'
  ``train`` → ``evaluate`` task runs and its rungs' ``promote`` tasks; it ends when its last rung closes. A bracket
  above ``GROUP_SIZE`` trial-rungs is split in parts (``bracket s=4 · part 2``).
- **ASHA** (no bracket ever closes): one subflow run per rung (a resource level), ``r=3 · trial-rungs``, open
  until the job ends. Rungs are how ASHA is read (how many reached r, who got promoted). A rung above
  ``GROUP_SIZE`` trial-rungs draws its graph on request (Prefect's "Display graph"), the job's graph always.
  Measured: splitting a rung by count (a new subflow run every 500 of its trial-rungs) halved the job's results
  per second from the second subflow of a rung on (1,500 configs, 8 slots: 50.4 then 23.2 results/s; one
  subflow run per rung: 44.5 and 52.4; no groups: 48.1 and 53.2), for a reason not found yet, so ASHA's
  rungs are not split.

``GROUP_SIZE`` = 500 trial-rungs is 1,000 task runs per bracket part, half of what Prefect draws by default; the
job's own graph holds one node per group (3 for an ASHA job with R=9, eta=3, at any size). A group's subflow run is
started on its first trial-rung from a thread of its own, which waits in the subflow until the group ends (a
Hyperband bracket's, as the bracket before it begins, once that one's runs: a job stopped in between leaves it
empty, Completed); the
trial-rungs' threads run in a copy of its context, so their task runs (and, with ``--trial-pool``, their flow
runs) land under it. The priors' mode (trained first) and the default config's baseline stay in the job's own
run. Should a group's subflow run not start (the API, say), its trial-rungs run in the job's run, said once.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefect import flow

from prefect_hyperband.executors.threads import in_the_jobs_run
from prefect_hyperband.hyperband.first import BASELINE_BRACKET, PRIOR_BRACKET
from prefect_hyperband.hyperband.scheduler import Decision
from prefect_hyperband.hyperband.trial import TrialRung

T = TypeVar("T")

FLOW_NAME = "hyperband-group"
#: trial-rungs per group: 2 task runs each, half the 2,000 nodes Prefect's run graph draws without asking
GROUP_SIZE = 500
#: seconds a trial-rung waits for its group's subflow run to start before it runs in the job's run
START_TIMEOUT = 60.0
#: seconds between a group started ahead's looks at whether the job ended while it waits for the one before
AHEAD_POLL = 0.05


@dataclass(eq=False)
class _Group:
    title: str
    bracket: int
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    context: contextvars.Context | None = None
    dealt: int = 0
    active: int = 0
    thread: threading.Thread | None = None


class Groups:
    """Which group a trial-rung runs in, and the groups' subflow runs; made inside the job's flow run."""

    def __init__(self, mode: str, size: int | None = None, warn: Callable[[str], None] = lambda m: None,
                 upcoming: Sequence[int] = ()) -> None:
        """``upcoming``: the brackets not done when the job (re)starts, in the order they run (Hyperband), read from
        the scheduler by the loop's thread before any trial-rung runs (never from a trial-rung's thread: the scheduler
        is the loop's alone); as a bracket begins, the next of them with no trial-rung dealt yet starts its group
        too, so that its subflow run is running when its first trial-rung comes instead of delaying it
        (docs/benchmarks.md, issue 86). One that ends in this job was dealt here, so it is never started again."""
        self.mode, self.size, self.warn, self.upcoming = mode, size or GROUP_SIZE, warn, tuple(upcoming)
        self.closed = False  # the job is over: no group starts ahead any more
        self.base = contextvars.copy_context()  # the job flow run's: a group's subflow run is its child
        self.lock = threading.Lock()
        self.open: dict[tuple[Any, ...], _Group] = {}
        self.ended: list[_Group] = []  # groups ended while the job ran: their runs may still be finishing
        self.dealt: Counter[tuple[Any, ...]] = Counter()  # trial-rungs dealt per bracket (hyperband) or resource
        self.warned = False

    def enter(self, trial_rung: TrialRung) -> tuple[contextvars.Context | None, Callable[[], None]]:
        """The context ``trial_rung``'s tasks run in (a copy of its group's subflow run's, which starts on the group's
        first trial-rung; None: the job's run) and the call that releases its place in the group once it ends (the
        executor's ``place``: ``executors.threads.ThreadExecutor``)."""
        group = self._take(trial_rung)
        if group is None:
            return in_the_jobs_run(trial_rung)
        if not group.ready.wait(START_TIMEOUT):
            self._failed(group, f"its subflow run did not start within {START_TIMEOUT:g} s")
        return (None if group.context is None else group.context.copy()), lambda: self._release(group)

    def in_bracket(self, bracket: int, fn: Callable[[], T]) -> T:
        """``fn()`` (a rung's ``promote`` task) in the bracket's latest group; in the job's run otherwise."""
        with self.lock:
            found = [g for k, g in self.open.items() if g.bracket == bracket and k[0] == "bracket"]
        group = found[-1] if found else None
        if group is None or group.context is None:
            return fn()
        return group.context.copy().run(fn)

    def settled(self, decisions: list[Decision]) -> None:
        """A synchronous bracket's group ends once its last rung has closed (after that rung's ``promote``)."""
        for d in decisions:
            if d.kind == "rung_closed" and d.rung == d.n_rungs - 1:
                with self.lock:
                    ended = [k for k, g in self.open.items() if k[0] == "bracket" and g.bracket == d.bracket]
                    groups = [self.open.pop(k) for k in ended]
                    self.ended += groups
                for g in groups:
                    g.done.set()

    def close(self, timeout: float = 10.0) -> None:
        """End every group still open (the job is over: finished, stopped or failed) and wait for every group's run,
        those ended earlier too: a subflow run that logs its end after the process began to exit printed a
        "Logging error" traceback under the job's summary."""
        with self.lock:
            groups, self.open, self.closed = list(self.open.values()), {}, True
            ended, self.ended = self.ended, []
        for g in groups:
            g.done.set()
        for g in [*ended, *groups]:  # each up to ``timeout``: a run finishing while its API is away retries
            if g.thread is not None:
                g.thread.join(timeout)

    # -- inside

    def _key(self, trial_rung: TrialRung) -> tuple[tuple[Any, ...], str, int] | None:
        """The group's key and title for the next trial-rung like ``trial_rung`` (counted here: call under the lock)."""
        if trial_rung.bracket in (PRIOR_BRACKET, BASELINE_BRACKET):  # one trial-rung apart: in the job's own run
            return None
        level = ("bracket", trial_rung.bracket) if self.mode != "asha" else ("r", trial_rung.resource)
        n = self.dealt[level]
        self.dealt[level] += 1
        part = n // self.size
        if level[0] == "bracket":
            title = f"bracket s={trial_rung.bracket}" + (f" · part {part + 1}" if part else "")
            return (*level, part), title, trial_rung.bracket
        return (*level, 0), f"r={trial_rung.resource} · trial-rungs", trial_rung.bracket  # one per rung: see the module's notes

    def _take(self, trial_rung: TrialRung) -> _Group | None:
        with self.lock:
            found = self._key(trial_rung)
            if found is None:
                return None
            key, title, bracket = found
            group = self.open.get(key)
            if group is None:
                group = self.open[key] = _Group(title, bracket)
                self._start(group)
            if not group.dealt and key[-1] == 0:  # the bracket begins: the next one's group starts after this one's
                self._ahead(bracket, group.ready)
            group.dealt += 1
            group.active += 1
            return group

    def _ahead(self, started: int, after: threading.Event) -> None:
        """The group of the bracket after ``started`` among ``upcoming``, started once ``after`` is set (the
        started one's subflow run is running: two starting at once delay the first) if none of its trial-rungs was
        dealt (call under the lock)."""
        if self.mode == "asha" or self.closed:
            return
        brackets = self.upcoming  # the loop's snapshot: nothing of the scheduler is read on this trial-rung's thread
        later = brackets[brackets.index(started) + 1:] if started in brackets else ()
        for b in later[:1]:
            key = ("bracket", b, 0)
            if key not in self.open and not self.dealt[("bracket", b)]:
                self.open[key] = _Group(f"bracket s={b}", b)
                self._start(self.open[key], after)

    def _release(self, group: _Group) -> None:
        with self.lock:
            group.active -= 1

    def _start(self, group: _Group, after: threading.Event | None = None) -> None:
        def body(title: str) -> None:
            group.context = contextvars.copy_context()  # this subflow run's: its trial-rungs' tasks land under it
            group.ready.set()
            group.done.wait()
            # nothing returned: Prefect links a later task's input to a run whose result is the same object (by
            # id), and a small int is one object everywhere: the UI then failed on the job's Task Runs tab

        subflow = flow(name=FLOW_NAME, flow_run_name="{title}", log_prints=False, validate_parameters=False,
                       persist_result=False)(body)

        def call() -> None:
            if after is not None and not _waited(after, group.done):  # the job ended first: no subflow run after it
                group.ready.set()
                return
            try:
                subflow(group.title)
            except BaseException as exc:  # noqa: BLE001 (the API, a stop): its trial-rungs run in the job's run
                if after is None or not self._withdrawn(group):
                    self._failed(group, f"{type(exc).__name__}: {exc}")

        group.thread = threading.Thread(target=self.base.copy().run, args=(call,), daemon=True,
                                        name=f"hyperband-group {group.title}")
        group.thread.start()

    def _withdrawn(self, group: _Group) -> bool:
        """A group started ahead whose subflow run did not start (its API away, say) while none of its trial-rungs
        was dealt: forgotten, so that its bracket's first trial-rung starts it as any group starts (after the API
        wait the trial-rungs go through), not run in the job's run with a warning."""
        with self.lock:
            if group.dealt or self.open.get(("bracket", group.bracket, 0)) is not group:
                return False
            del self.open[("bracket", group.bracket, 0)]
        group.ready.set()
        return True

    def _failed(self, group: _Group, why: str) -> None:
        if not group.ready.is_set():
            group.ready.set()
            if not self.warned:
                self.warned = True
                self.warn(f"trial-rungs of {group.title} run in the job's flow run: its group's subflow run did not start ({why})")


def _waited(after: threading.Event, done: threading.Event) -> bool:
    """Waits for ``after`` (up to ``START_TIMEOUT``) unless ``done`` is set first (the job's ``close``, or the group
    ended): whether the group started ahead may start its subflow run. ``close`` does not wait its join timeout out
    on a group whose predecessor's run never started."""
    deadline = time.monotonic() + START_TIMEOUT
    while not after.wait(AHEAD_POLL) and not done.is_set() and time.monotonic() < deadline:
        pass
    return not done.is_set()
