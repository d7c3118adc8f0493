"""Worker groups on a cluster that changes (fakes of the Dask client, no processes): a group that lost a worker is
retired, its other workers regroup with the workers that joined since; a trial-rung whose group lost a worker runs
again on another group, twice, then fails naming each loss."""

from __future__ import annotations

import types

import pytest

from prefect_hyperband.executors import dask_groups, dask_ranks, dask_xgboost
from prefect_hyperband.executors.dask_ranks import DaskRanks, GroupLost


class FakeClient:
    status = "running"

    def __init__(self, workers: list[str]) -> None:
        self.workers = list(workers)
        self.busy: set[str] = set()
        self.gone: set[str] = set()  # listed by the scheduler, gone before it is asked (Dask's run errs for it)

    def scheduler_info(self) -> dict:  # the scheduler's identity, as ``dask_groups.workers_of`` asks for it
        return {"workers": {a: {"host": dask_groups.host_of(a)} for a in self.workers}}

    @property
    def scheduler(self):
        return types.SimpleNamespace(identity=lambda n_workers: self.scheduler_info())

    def sync(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def run(self, fn, workers: list[str], on_error: str = "raise") -> dict:
        assert fn is dask_groups.executing
        if self.gone & set(workers) and on_error == "raise":
            raise OSError(f"Timed out trying to connect to {sorted(self.gone & set(workers))[0]}")
        return {a: int(a in self.busy) for a in workers if on_error != "ignore" or a not in self.gone}


A, B, C, D, E = (f"tcp://127.0.0.1:{p}" for p in (1, 2, 3, 4, 5))


def test_groups_are_disjoint_and_packed_by_host():
    addresses = ["tcp://127.0.0.3:9", "tcp://127.0.0.1:40", "tcp://127.0.0.2:7", "tcp://127.0.0.2:30", "tcp://127.0.0.1:5"]
    assert dask_groups.split(addresses, 2) == [("tcp://127.0.0.1:5", "tcp://127.0.0.1:40"),
                                               ("tcp://127.0.0.2:7", "tcp://127.0.0.2:30")]
    assert dask_groups.split(addresses, 3) == [("tcp://127.0.0.1:5", "tcp://127.0.0.1:40", "tcp://127.0.0.2:7")]
    assert dask_groups.host_of("tcp://[::1]:8786") == "::1" and dask_groups.host_of("tls://head:8786") == "head"


def test_a_retired_group_regroups_its_other_worker_with_a_newcomer():
    client = FakeClient([A, B, C, D])
    kept = []
    groups = dask_groups.WorkerGroups(client, 2, lambda g: kept.append(g) or f"data of {g}")
    assert groups.groups == [(A, B), (C, D)]
    client.workers.remove(B)  # killed
    groups.retire((A, B))
    assert groups.groups == [(C, D)] and groups.retired == [(A, B)]  # A alone makes no group
    client.workers.append(E)  # B restarted under a new address
    client.busy = {A}  # still running its lost group's rank: not regrouped until it ends
    with groups.take() as (group, data):
        assert group == (C, D) and groups.groups == [(C, D)]
    client.busy = set()
    with groups.take() as (group, data):  # the next trial-rung regroups first
        assert group in {(C, D), (A, E)}
    assert groups.groups == [(C, D), (A, E)] and kept[-1] == (A, E)
    taken = set()
    with groups.take() as (g1, _), groups.take() as (g2, d2):
        taken = {g1, g2}
        assert d2 == f"data of {g2}"
    assert taken == {(C, D), (A, E)}


def test_a_worker_gone_between_the_schedulers_list_and_the_question_is_left_out_of_the_new_groups():
    client = FakeClient([A, B, C, D])
    groups = dask_groups.WorkerGroups(client, 2, lambda g: None)
    client.workers.remove(B)
    client.workers.append(E)
    client.gone = {D}  # still on the scheduler's list, no longer answering
    groups.retire((A, B))  # (C, D) is a group: its loss is its trial-rung's to find
    assert groups.groups == [(C, D), (A, E)]
    groups.retire((C, D))
    assert groups.groups == [(A, E)]  # C alone, D gone: no group, and no error
    client.gone, client.workers = set(), [A, C, E, B]  # D's machine back under B's address
    assert groups.regroup() == [(B, C)]


def test_with_no_group_left_a_trial_rung_waits_for_workers_then_says_so_in_one_line():
    client = FakeClient([A, B])
    groups = dask_groups.WorkerGroups(client, 2)
    client.workers.remove(B)
    groups.retire((A, B))
    with pytest.raises(RuntimeError, match="has 1 workers left, fewer than --workers 2, and none came back in 0.5 s"):
        with groups.take(wait=0.5):
            pass


def test_in_a_job_no_group_left_past_the_wait_stops_the_job_saved_for_resume_with_one_line(caplog):
    from prefect_hyperband.trainers import stopping

    client = FakeClient([A, B])
    groups = dask_groups.WorkerGroups(client, 2)
    client.workers.remove(B)
    groups.retire((A, B))
    token = stopping.StopToken()
    with stopping.bind(token), pytest.raises(stopping.Stopped, match="fewer than --workers 2"):
        with groups.take(wait=1.0):
            pass
    assert token.requested() and "none came back in 1 s" in token.reason
    said = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert said == ["the Dask cluster has 1 workers, fewer than --workers 2: waiting up to 1 s for workers to join"]


class FakeFuture:
    def __init__(self, status: str = "pending") -> None:
        self.status = status

    def done(self) -> bool:
        return self.status != "pending"

    def cancelled(self) -> bool:
        return self.status == "cancelled"

    def cancel(self) -> None:
        self.status = "cancelled"

    def exception(self):
        return ConnectionResetError("peer closed")

    def result(self):
        if self.status == "finished":
            return "done"
        raise ConnectionResetError("peer closed")


def test_gather_gives_up_a_group_whose_worker_left_and_not_a_task_cancelled_by_the_scheduler(monkeypatch):
    """A task on a dead worker never ends (``client.gather`` waited forever: issue 87); one whose scattered input died
    with its worker is cancelled by the scheduler before it lists the worker gone: both are ``GroupLost``."""
    import distributed

    monkeypatch.setattr(distributed, "wait", lambda futures, timeout, return_when: None)
    client = FakeClient([A, B])
    client.workers.remove(B)
    hung = [FakeFuture("finished"), FakeFuture()]
    with pytest.raises(GroupLost, match=f"{B} of group {A}, {B} left the cluster"):
        dask_groups.gather(client, hung, (A, B), poll=0.01)
    assert hung[1].cancelled()  # the other ranks are given up
    client = FakeClient([A, B])
    forgotten = [FakeFuture("cancelled")]
    looks = []

    def identity(n_workers):
        looks.append(1)
        if len(looks) == 3:  # the scheduler drops the dead worker a moment after the cancel
            client.workers.remove(B)
        return client.scheduler_info()

    monkeypatch.setattr(FakeClient, "scheduler", property(lambda self: types.SimpleNamespace(identity=identity)))
    with pytest.raises(GroupLost):
        dask_groups.gather(client, forgotten, (A, B), poll=0.01, grace=5)
    client.workers.append(B)
    with pytest.raises(ConnectionResetError):  # the trial's own error, every rank ended: raised as it is
        dask_groups.gather(client, [FakeFuture("error")], (A, B), poll=0.01, grace=5)


class HeldResult(FakeFuture):
    """Finished, its result on a worker killed since: fetching it, the scheduler cancels the task it cannot compute
    again ("Couldn't gather 1 keys, rescheduling", then ``FutureCancelledError``)."""

    def result(self):
        from distributed.client import FutureCancelledError

        self.status = "cancelled"
        raise FutureCancelledError("hyperband-xgboost-0", "unknown")


def test_gather_gives_up_a_group_whose_finished_result_was_lost_with_its_worker(monkeypatch):
    import distributed

    monkeypatch.setattr(distributed, "wait", lambda futures, timeout, return_when: None)
    client = FakeClient([A, B])
    with pytest.raises(GroupLost, match="FutureCancelledError"):
        dask_groups.gather(client, [FakeFuture("finished"), HeldResult("finished")], (A, B), poll=0.01, grace=0.2)


def ranks(client: FakeClient, monkeypatch, lose: int) -> tuple[DaskRanks, list]:
    """DaskRanks over a fake client whose first ``lose`` attempts lose a worker of their group."""
    monkeypatch.setattr(dask_groups, "connect", lambda address, workers: client)
    r = DaskRanks("tcp://head:8786", 2)
    tried = []

    def attempt(task, job, previous, group, hosts, data, ends):
        assert hosts == [dask_groups.host_of(a) for a in group]
        tried.append(group)
        if len(tried) <= lose:
            client.workers.remove(group[-1])
            raise GroupLost(group, [group[-1]], ConnectionResetError("peer closed"))
        return [f"rank {i} on {a}" for i, a in enumerate(group)]

    monkeypatch.setattr(r, "_attempt", attempt)
    return r, tried


def test_a_trial_rung_whose_group_lost_a_worker_runs_again_on_another_group(monkeypatch):
    client = FakeClient([A, B, C, D, E])
    r, tried = ranks(client, monkeypatch, lose=1)
    ran = r.run(print, {}, None, deadline=60)
    assert tried == [(A, B), (C, D)] and ran.group == (C, D) and ran.attempts == 2
    assert ran.results == [f"rank 0 on {C}", f"rank 1 on {D}"] and ran.lost_worker_seconds >= 0
    assert r.groups == [(C, D), (A, E)]  # the lost group's other worker regrouped with the spare


def test_a_trial_rung_that_lost_three_groups_fails_naming_each_loss(monkeypatch):
    client = FakeClient([A, B, C, D, E, "tcp://127.0.0.1:6"])
    r, tried = ranks(client, monkeypatch, lose=3)
    with pytest.raises(RuntimeError, match="lost its Dask group 3 times") as failed:
        r.run(print, {}, None, deadline=60)
    assert len(tried) == 3 == dask_ranks.RETRIES + 1
    assert all(f"{g[-1]} of group {', '.join(g)} left the cluster: ConnectionResetError: peer closed" in str(failed.value)
               for g in tried)


def test_a_reserved_group_is_the_one_its_thread_takes_and_a_retry_after_a_loss_takes_another(monkeypatch):
    import threading

    from prefect_hyperband.trainers.base import placement

    client = FakeClient([A, B, C, D, E, "tcp://127.0.0.1:6"])
    r, tried = ranks(client, monkeypatch, lose=0)
    with placement(r) as group:  # what the job tags the trial-rung's task runs with
        assert group == (A, B)
        elsewhere: list = []  # another thread's trial-rung: not the reserved group
        other = threading.Thread(target=lambda: elsewhere.append(r.run(print, {}, None, deadline=60).group))
        other.start()
        other.join()
        assert elsewhere == [(C, D)]
        assert r.run(print, {}, None, deadline=60).group == (A, B)
    r, tried = ranks(FakeClient([A, B, C, D, E, "tcp://127.0.0.1:6"]), monkeypatch, lose=1)
    with placement(r) as group:
        ran = r.run(print, {}, None, deadline=60)
    assert group == (A, B) and tried == [(A, B), (C, D)] and ran.group == (C, D)  # the retry left the lost group
    with placement(object()) as here:  # a trainer without a cluster's groups trains here
        assert here == ()


def test_a_taken_group_is_checked_and_its_hosts_read_from_one_look_at_the_scheduler(monkeypatch):
    """CI: a worker killed between the check of its taken group and a second look for its host failed the
    trial-rung with KeyError(address). One look serves both; a worker gone by then is a lost group's (its
    rank's launch or wait sees it), and one gone before costs no attempt."""

    import contextlib

    class LeavingClient(FakeClient):  # once armed, B leaves right after the next look at the workers
        armed = False

        def scheduler_info(self) -> dict:
            info = super().scheduler_info()
            if self.armed and B in self.workers:
                self.workers.remove(B)
            return info

    client = LeavingClient([A, B, C, D])
    r, tried = ranks(client, monkeypatch, lose=0)
    take = r.worker_groups.take

    @contextlib.contextmanager
    def taken(*args, **kwargs):  # arm as soon as a group is taken
        with take(*args, **kwargs) as item:
            client.armed = True
            yield item

    monkeypatch.setattr(r.worker_groups, "take", taken)
    ran = r.run(print, {}, None, deadline=60)
    assert client.workers == [A, C, D]  # B left after the look that found it
    assert tried == [(A, B)] and ran.attempts == 1  # the hosts of that same look: no KeyError
    ran = r.run(print, {}, None, deadline=60)  # B is gone now: its group is retired before any attempt
    assert tried == [(A, B), (C, D)] and ran.group == (C, D) and ran.attempts == 1


@pytest.mark.slow  # a real scheduler (in this process), its client refreshing its cache every 5 ms
def test_the_workers_are_asked_for_each_look_not_read_from_the_clients_cache():
    """``client.scheduler_info()`` returns the client's cached identity, which the client's periodic refresh
    overwrites with totals and no workers: a look between the two saw every worker of a group gone, and in CI a
    healthy group was retired mid-job. ``workers_of`` asks the scheduler for each look: four threads looking for
    3 s while the cache is refreshed every 5 ms never see fewer than the two workers."""
    import threading
    import time

    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        seen: list[int] = []

        def look() -> None:
            ends = time.monotonic() + 3
            while time.monotonic() < ends:
                seen.append(len(dask_groups.workers_of(client)))

        threads = [threading.Thread(target=look) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(seen) > 100 and set(seen) == {2}


def test_xgboost_s_trial_rungs_stop_the_job_when_the_client_lost_its_scheduler_for_good():
    """Dask's client closes itself once it fails to reconnect: the trial-rung in flight, and the job, stop (saved
    for --resume), rather than every later trial failing on a closed client (seen in CI on a loaded machine)."""
    from prefect_hyperband.trainers import stopping

    client = FakeClient([A, B])
    placement = dask_xgboost.XGBoostOnDask.__new__(dask_xgboost.XGBoostOnDask)
    placement.client, placement.address, placement.cluster = client, "tcp://head:8786", None
    placement.worker_groups = dask_groups.WorkerGroups(client, 1)

    def training(group, data):
        client.status = "closed"  # the reconnection failed while it trained
        raise AttributeError("'NoneType' object has no attribute 'identity'")

    token = stopping.StopToken()
    with stopping.bind(token), pytest.raises(stopping.Stopped, match="Dask scheduler at tcp://head:8786 is unreachable"):
        placement.run(training)
    assert token.requested() and "unreachable" in token.reason
    client.status = "running"
    with pytest.raises(ValueError):  # a trial-rung's own error, the scheduler there: the trial's, as before
        placement.run(lambda group, data: (_ for _ in ()).throw(ValueError("bad config")))
