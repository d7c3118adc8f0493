"""Disjoint groups of ``n`` Dask workers, each running one trial-rung at a time: the rule the XGBoost and the torch
trainers share on a cluster.

The cluster's W workers make W // n groups (the rest wait unused). A group is packed on as few hosts as the
workers allow (workers sorted by host, then port), since ranks on one host talk through its memory. A trial-rung
takes a free group and gives it back: two trial-rungs never share a worker, so two collectives never interleave
on one worker (they would deadlock on single-threaded workers). A group that lost a worker is retired and its
other workers regroup with the workers that joined since.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import stopping

#: seconds between looks for a free group
POLL = 0.5
#: seconds a trial-rung waits for workers to come back when every group lost one
REGROUP_WAIT = 120.0
#: seconds between looks at a group's workers while its tasks run (a worker lost mid-task: its task never ends)
WATCH_POLL = 0.5
#: seconds to look for a lost worker after a task's error (the scheduler may learn of it after the peers)
LOST_GRACE = 10.0
#: times a trial-rung's training runs again on another group after its group lost a worker (then the trial fails)
RETRIES = 2

log = logging.getLogger(__name__)


class GroupLost(RuntimeError):
    """A worker of the group running a trial-rung left the cluster (killed, its machine gone)."""

    def __init__(self, group: tuple[str, ...], gone: list[str], cause: BaseException | None) -> None:
        self.group, self.gone = group, gone
        why = f": {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}" if cause else ""
        lost = f"Dask worker(s) {', '.join(gone)} of group {', '.join(group)} left the cluster" if gone else (
            f"the scheduler cancelled a task of group {', '.join(group)} (data a lost worker held)")
        super().__init__(f"{lost}{why}")


def workers_of(client: Any) -> dict[str, Any]:
    """The scheduler's workers now (address -> its info: ``host``, ...), fetched for this call alone. Not
    ``client.scheduler_info()``: that returns the client's one cached copy, which the client's periodic refresh
    (every 2 s) overwrites with the cluster's totals and no workers, so a look that lands between the two sees none
    and every worker of a group looks lost (with the refresh every 5 ms, 927 of 40,875 looks from four threads; in
    CI a healthy group was retired mid-job)."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def gpu_resources(client: Any, addresses: tuple[str, ...]) -> dict[str, float]:
    """Dask's ``resources`` a rank on these workers takes: one GPU where every one of them was started with
    ``--resources GPU=1`` (or more; the task then holds a GPU of its worker), none otherwise (a task asking for a
    resource its worker lacks would never run)."""
    info = workers_of(client)
    has = [float((info.get(a) or {}).get("resources", {}).get("GPU", 0)) >= 1 for a in addresses]
    return {"GPU": 1} if has and all(has) else {}


def connect(address: str, workers: int):
    """A ``distributed.Client`` of the scheduler at ``address`` with at least ``workers`` workers (else one line)."""
    from distributed import Client

    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise InputError(f"cannot reach the Dask scheduler at {address}: {exc}") from exc
    available = len(workers_of(client))
    if available < workers:
        client.close()
        raise InputError(f"the Dask cluster at {address} has {available} workers, fewer than --workers {workers}")
    return client


def stop_if_unreachable(client: Any, address: str, grace: float = LOST_GRACE) -> None:
    """After a trial-rung's error: where the client lost its scheduler and did not get it back within ``grace``
    seconds (Dask's client closes itself once its reconnection fails), the job stops, its state saved, and
    ``--resume`` continues once the scheduler is back (raises ``stopping.Stopped``); else returns (the error is the
    trial-rung's own)."""
    ends = time.monotonic() + grace
    while client.status != "running":
        if client.status in ("closed", "closing", "failed") or time.monotonic() > ends:
            reason = f"the Dask scheduler at {address} is unreachable"
            token = stopping.current()
            if token is not None:
                token.request(reason=reason)
            raise stopping.Stopped(reason) from None
        time.sleep(0.2)


def cluster_size(address: str, workers: int) -> int:
    """Workers of the cluster at ``address`` (one short connection; ``connect``'s checks): a job's preflight."""
    client = connect(address, workers)
    try:
        return len(workers_of(client))
    finally:
        client.close()


def gone_of(client: Any, group: tuple[str, ...], alive: Any = None) -> list[str]:
    """The group's workers not among ``alive`` (the scheduler's workers, asked now if not given)."""
    alive = workers_of(client) if alive is None else alive
    return [a for a in group if a not in alive]


def gather(client: Any, futures: list, group: tuple[str, ...], poll: float = WATCH_POLL,
           grace: float = LOST_GRACE) -> list[Any]:
    """The results of ``futures`` (tasks pinned to ``group``'s workers), watching the group meanwhile: a worker of
    it gone (the scheduler's worker removal: SIGKILL, a machine lost) raises ``GroupLost`` within ``poll`` seconds,
    its tasks cancelled, where ``client.gather`` would wait forever (a task pinned to a dead worker never runs
    again). A task's error raises at once, unless a worker of the group is seen gone within ``grace`` seconds (a
    peer's "Connection reset" comes before the scheduler sees the worker go): then ``GroupLost`` too."""
    from distributed import wait
    from distributed.client import FuturesCancelledError

    pending = list(futures)
    try:
        while pending:
            # Dask's wait raises when none is done in time, and when one was cancelled: the scheduler forgets a
            # task whose input (scattered rows) died with its worker ("already forgotten")
            with contextlib.suppress(TimeoutError, FuturesCancelledError):
                wait(pending, timeout=poll, return_when="FIRST_COMPLETED")
            done = [f for f in pending if f.done()]  # one look: a future cancelled after it is not dropped unseen
            erred = [f for f in done if f.status != "finished"]
            if erred:
                _raise_if_lost(client, group, futures, grace, erred)
                erred[0].result()  # raises the task's own error (or CancelledError)
            ended = {id(f) for f in done}
            pending = [f for f in pending if id(f) not in ended]
            if pending:
                gone = gone_of(client, group)
                if gone:
                    raise GroupLost(group, gone, None)
                stopping.check()
        return _results(client, futures, group, grace)
    except BaseException:
        for f in futures:
            with contextlib.suppress(Exception):
                f.cancel()
        raise


def _results(client: Any, futures: list, group: tuple[str, ...], grace: float) -> list[Any]:
    """The finished tasks' results, fetched from the workers that hold them: a worker killed after its task finished
    takes the result with it, and the scheduler, unable to compute it again without the rows it held, cancels it
    ("Couldn't gather 1 keys, rescheduling", then ``FutureCancelledError``): ``GroupLost``, not the trial's error."""
    try:
        return [f.result() for f in futures]
    except Exception as exc:
        _raise_if_lost(client, group, futures, grace, futures, exc)
        raise


def _raise_if_lost(client: Any, group: tuple[str, ...], futures: list, grace: float, erred: list,
                   exc: BaseException | None = None) -> None:
    """``GroupLost`` (carrying ``exc``, else the first of ``erred``'s error) where a worker of the group is gone or one
    of ``erred`` was cancelled by the scheduler, not us: its data was lost with a worker (under load its removal can
    reach the worker list after the grace); nothing where the error is the task's own."""
    gone = _lost(client, group, futures, grace)
    if gone or any(f.cancelled() for f in erred):
        if exc is None:
            with contextlib.suppress(BaseException):  # a cancelled future has none: it raises
                found = erred[0].exception()
                exc = found if isinstance(found, BaseException) else None
        raise GroupLost(group, gone, exc) from exc


def _lost(client: Any, group: tuple[str, ...], futures: list, grace: float) -> list[str]:
    """The group's workers gone, given a task's error: looked at until the scheduler says so, every task has ended
    by itself (the trial's own error: a dead worker's task never ends), or ``grace`` seconds. A task cancelled (not
    by us: the scheduler forgot it with the rows its dead worker held) is looked at for the whole grace: the client
    hears of the cancel before the scheduler's list of workers drops the dead one."""
    ends = time.monotonic() + grace
    while True:
        gone = gone_of(client, group)
        ended = all(f.done() for f in futures) and not any(f.cancelled() for f in futures)
        if gone or ended or time.monotonic() > ends:
            return gone
        time.sleep(0.1)


def executing(dask_worker: Any) -> int:
    """Tasks running in this worker's threads, cancelled ones included (``client.run`` passes the worker)."""
    return len(dask_worker.state.executing) + len(dask_worker.state.long_running)


def host_of(address: str) -> str:
    """``tcp://10.0.0.5:41234`` -> ``10.0.0.5`` (IPv6 ``tcp://[::1]:41234`` -> ``::1``)."""
    rest = address.split("://", 1)[-1]
    host = rest.rsplit(":", 1)[0]
    return host.strip("[]")


def _port(address: str) -> int:
    tail = address.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def split(addresses: list[str], n: int) -> list[tuple[str, ...]]:
    """Disjoint groups of ``n`` of ``addresses``, packed by host: each group on as few hosts as possible."""
    ordered = sorted(addresses, key=lambda a: (host_of(a), _port(a)))
    return [tuple(ordered[i : i + n]) for i in range(0, len(ordered) - n + 1, n)]


class WorkerGroups:
    """The groups of a client's cluster; ``prepare(group)`` is what each group keeps (its data, say).

    A group that lost a worker is retired; its other workers and any worker that joined since (a worker Dask's
    nanny restarted comes back under a new address) make new groups as soon as there are ``n`` of them.
    """

    def __init__(self, client: Any, n: int, prepare: Callable[[tuple[str, ...]], Any] = lambda group: None) -> None:
        self.client, self.n, self._prepare = client, n, prepare
        self._lock = threading.Lock()
        self._free: queue.Queue | None = queue.Queue()
        self.groups: list[tuple[str, ...]] = []  # the live ones, free or busy
        self.retired: list[tuple[str, ...]] = []
        self._reserved = threading.local()  # the group ``reserve`` holds for the calling thread's next ``take``
        self._gpus: dict[tuple[str, ...], dict[str, float]] = {}  # ``gpus``: a worker's resources are its own for life
        self._said = False  # the one line of a wait for workers: said once until a group forms again
        self._add(split(self.alive(), n))

    def gpus(self, group: tuple[str, ...]) -> dict[str, float]:
        """``gpu_resources`` of ``group``, asked of the scheduler once per group, not at every trial-rung."""
        with self._lock:
            known = self._gpus.get(group)
        if known is None:
            known = gpu_resources(self.client, group)
            with self._lock:
                self._gpus[group] = known
        return known

    def alive(self) -> list[str]:
        return list(workers_of(self.client))

    def _add(self, groups: list[tuple[str, ...]]) -> None:
        for group in groups:
            item = (group, self._prepare(group))
            with self._lock:
                self.groups.append(group)
                self._said = False
            if self._free is not None:
                self._free.put(item)

    def regroup(self) -> list[tuple[str, ...]]:
        """New groups of the idle live workers that are in no group (a retired group's, newcomers'); the new ones."""
        with self._lock:
            grouped = {a for g in self.groups for a in g}
        free = [a for a in self.alive() if a not in grouped]
        if len(free) < self.n:
            return []
        # a worker still running a rank of its lost group's trial-rung would hold up a new group's rendezvous: Dask
        # cannot stop a running task (a cancelled one runs on, and the scheduler no longer lists it; the rank ends
        # at its collective's error or timeout), so ask the workers themselves, and group only the idle ones; one
        # gone since the scheduler's list does not answer (left out: the next regroup looks again)
        running = self.client.run(executing, workers=free, on_error="ignore")
        new = split([a for a in free if not running.get(a, 1)], self.n)
        self._add(new)
        return new

    def retire(self, group: tuple[str, ...]) -> None:
        """``group`` lost a worker: no trial-rung takes it again; its other workers regroup."""
        with self._lock:
            if group in self.groups:
                self.groups.remove(group)
                self.retired.append(group)
        self.regroup()

    @contextlib.contextmanager
    def reserve(self) -> Iterator[tuple[str, ...]]:
        """Take a free group for the calling thread before its trial-rung starts (the job tags the trial-rung's
        task runs with its workers); the thread's next ``take`` gets it, unless it was retired meanwhile."""
        with self.take() as item:
            self._reserved.item = item
            try:
                yield item[0]
            finally:
                self._reserved.item = None

    @contextlib.contextmanager
    def take(self, wait: float = REGROUP_WAIT) -> Iterator[tuple[tuple[str, ...], Any]]:
        """A free group and what it keeps, for one trial-rung (waits while every group is busy; while none is
        left, waits ``wait`` seconds for workers to come back, then fails in one line); the group the calling
        thread reserved, when it has one still live."""
        held = getattr(self._reserved, "item", None)
        if held is not None:
            with self._lock:
                live = held[0] in self.groups
            if live:  # (a retry after a loss finds it retired, and takes another)
                yield held
                return
        self.regroup()  # workers that joined since (a restarted one, a scaled-up cluster) make new groups
        waited, said = 0.0, False
        while True:
            free = self._free
            if free is None:
                raise RuntimeError("the Dask cluster of this trainer is closed (the job is stopping)")
            try:
                item = free.get(timeout=POLL)
                with self._lock:
                    if item[0] in self.groups:
                        break
                continue  # retired while it waited in the queue
            except queue.Empty:
                stopping.check()
                with self._lock:
                    live = bool(self.groups)
                if live:
                    continue
                if self.regroup():
                    continue
                if not said:  # one line while it waits (every waiting trial-rung's thread would say the same)
                    said = True
                    with self._lock:
                        first, self._said = not self._said, True
                    if first:
                        log.warning("the Dask cluster has %d workers, fewer than --workers %d: waiting up to %g s "
                                    "for workers to join", len(self.alive()), self.n, wait)
                waited += POLL
                if waited >= wait:
                    reason = (f"the Dask cluster has {len(self.alive())} workers left, fewer than --workers "
                              f"{self.n}, and none came back in {wait:g} s")
                    token = stopping.current()
                    if token is not None:  # the job stops, saved: --resume goes on once workers are back
                        token.request(reason=reason)
                        raise stopping.Stopped(reason) from None
                    raise RuntimeError(reason) from None
        group = item[0]
        try:
            yield item
        finally:
            with self._lock:
                live = group in self.groups
            if live and self._free is not None:
                self._free.put(item)

    def close(self) -> None:
        self._free = None
