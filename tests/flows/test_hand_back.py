"""A stopping ``hyperband worker`` hands back what it runs or took, and a trial-rung either leaves its result or is
handed back, never both."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from uuid import UUID

import pytest

from prefect_hyperband.flows import hand_back
from prefect_hyperband.trainers import stopping

RUN = "6f3c1b1e-52f5-4f4a-9a49-2f0c1f3a7c11"


@pytest.fixture
def server(monkeypatch):
    """Prefect's client on a server of task runs in memory: ``marked`` lists each state set, ``states`` the latest."""
    import prefect.client.orchestration as orchestration

    marked, states = [], {}

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_task_run_state(self, run_id, state, force):
            marked.append((run_id, state.type.value, state.message, force))
            states[str(run_id)] = state

        def read_task_run(self, run_id):
            return SimpleNamespace(state=states.get(str(run_id)))

    monkeypatch.setattr(orchestration, "get_client", lambda sync_client: Client())
    monkeypatch.setattr(hand_back, "_running", {})
    monkeypatch.setattr(hand_back, "_returned", {})
    return SimpleNamespace(marked=marked, states=states)


def test_a_stopping_worker_marks_what_it_runs_crashed_and_stops_those_trainings(server):
    token = stopping.StopToken()
    hand_back._running[RUN] = token
    assert hand_back.hand_back(wait=0.0) == [RUN]
    assert server.marked == [(UUID(RUN), "CRASHED", hand_back.HANDED_BACK, True)] and token.requested()
    assert hand_back.hand_back(wait=0.0) == [RUN]  # still running: a second stop marks it again
    hand_back._running.clear()
    assert hand_back.hand_back(wait=0.0) == []
    # one it took from the server and had not begun (PENDING): no other worker gets it, so it is marked too
    taken = UUID("0a6c2d3e-1111-4f4a-9a49-2f0c1f3a7c12")
    server.marked.clear()
    assert hand_back.hand_back(wait=0.0, taken=[taken]) == [str(taken)]
    assert server.marked == [(taken, "CRASHED", hand_back.HANDED_BACK, True)]
    # the stop's second pass, for runs taken while the first waited: those of the first are not marked again
    server.marked.clear()
    hand_back._running[RUN] = token
    late = UUID("0a6c2d3e-2222-4f4a-9a49-2f0c1f3a7c13")
    assert hand_back.hand_back(wait=0.0, taken=[taken, late], besides=[RUN, str(taken)]) == [str(late)]
    assert server.marked == [(late, "CRASHED", hand_back.HANDED_BACK, True)]


def test_a_run_whose_result_is_written_is_not_handed_back_though_its_worker_still_holds_it(server):
    """The worker's stop after a trial-rung's result was written, before Prefect's engine ended its task run (the
    run still a taken one): it is not marked, so its job keeps the result and the worker does not count it."""
    with hand_back.running(RUN, stopping.StopToken()):
        assert hand_back._running
    with hand_back.ending(RUN) as why:
        assert why is None  # not given up: the result is written here
    assert hand_back.hand_back(wait=0.0, taken=[UUID(RUN)]) == [] and server.marked == []


def test_a_stop_while_a_result_is_written_waits_for_it_and_a_run_marked_first_writes_none(server):
    wrote = threading.Event()
    handed: list[list[str]] = []

    def write() -> None:
        with hand_back.ending(RUN) as why:
            assert why is None
            stopper.start()
            stopper.join(0.3)
            assert stopper.is_alive()  # the stop waits for the result written
            wrote.set()

    stopper = threading.Thread(target=lambda: handed.append(hand_back.hand_back(wait=0.0, taken=[RUN])))
    writer = threading.Thread(target=write)
    writer.start()
    writer.join(10)
    stopper.join(10)
    assert wrote.is_set() and handed == [[]] and server.marked == []
    # marked first (the stop before the run's last step): its last step hears it was handed back, and writes nothing
    other = "0a6c2d3e-3333-4f4a-9a49-2f0c1f3a7c14"
    assert hand_back.hand_back(wait=0.0, taken=[other]) == [other]
    with hand_back.ending(other) as why:
        assert why == hand_back.HANDED_BACK
    assert other not in hand_back._returned
