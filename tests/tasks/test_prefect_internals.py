"""``tasks/prefect_internals.py`` holds every private Prefect name the package uses and every patch of a library's
internals: each internal it reads or replaces takes what the package passes and does what the package relies on, on
whatever Prefect the declared range installs (a test per name, by behaviour), and none elsewhere in the package."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from prefect_hyperband.tasks import prefect_internals as patches

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("app", "flows", "tasks", "tracking", "executors", "trainers", "hyperband", "deployments", "examples", "common")


def test_the_internals_the_patches_replace_take_what_the_patches_pass():
    """The internals the patches replace, called as the patches call them, on whatever Prefect the declared range
    installs: a new 3.x passes unless one changed. What each patch does is tested by behaviour (below, and
    tests/flows/test_server.py, tests/flows/test_task_workers.py), not by Prefect's source text."""
    import prefect.logging.handlers as handlers
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.configurations import AioSqliteConfiguration
    from prefect.task_worker import TaskWorker

    assert list(inspect.signature(handlers.APILogWorker._handle_batch).parameters) == ["self", "items"]
    assert list(inspect.signature(SubprocessASGIServer._run_uvicorn_command).parameters) == ["self"]
    assert list(inspect.signature(AioSqliteConfiguration.begin_transaction).parameters) == [
        "self", "session", "with_for_update"]
    # a run is taken (its token asked for) as it arrives, before it waits for a slot; released as it ends
    assert list(inspect.signature(TaskWorker._acquire_token).parameters) == ["self", "task_run_id"]
    assert list(inspect.signature(TaskWorker._release_token).parameters) == ["self", "task_run_id"]


def test_a_remembering_task_worker_knows_what_it_took_until_it_ends():
    import asyncio

    from prefect.task_worker import TaskWorker

    from prefect_hyperband.flows import task_workers

    async def run():
        worker = patches.remembering_taken(TaskWorker)(task_workers.trial_rung, limit=1)
        assert await worker._acquire_token("run-1") and worker.taken == {"run-1"}
        waiting = asyncio.ensure_future(worker._acquire_token("run-2"))  # no free slot: it waits, taken all the same
        await asyncio.sleep(0)
        assert worker.taken == {"run-1", "run-2"} and not waiting.done()
        worker._release_token("run-1")
        assert await waiting and worker.taken == {"run-2"}
        assert worker.begun == {"run-2"}
        waiting = asyncio.ensure_future(worker._acquire_token("run-4"))  # waits for run-2's slot
        await asyncio.sleep(0)
        worker.closed = True  # stopping: a run sent now is noted and not begun (no token: Prefect's loop leaves it)
        worker._release_token("run-2")
        assert not await waiting  # nor one that waited for a slot: its slot is given back
        assert not await worker._acquire_token("run-3") and worker.taken == {"run-3", "run-4"}
        assert worker.available_tasks == 1 and worker.begun == set()

    asyncio.run(run())


def test_a_closed_workers_subscription_ends_and_connects_no_more():
    """A stopping worker's subscription (``patches._ending``): ended at its next step once closed, when its socket is
    closed under a step waiting for a run, and when it would connect again; open, a lost socket is Prefect's to
    handle."""
    import asyncio

    import websockets.exceptions

    class Subscription:  # Prefect's, as its internals are checked above
        def __init__(self) -> None:
            self._websocket, self.connects, self.sent = None, 0, asyncio.Queue()

        async def _ensure_connected(self) -> None:
            if self._websocket is None:
                self.connects += 1
                self._websocket = object()

        async def __anext__(self):
            await self._ensure_connected()
            item = await self.sent.get()
            if item == "closed":
                raise websockets.exceptions.ConnectionClosedOK(None, None)
            return item

    async def run():
        worker = SimpleNamespace(closed=False, subscription=None)
        sub = patches._ending(Subscription, worker)()
        assert worker.subscription is sub
        sub.sent.put_nowait("run-1")
        assert await sub.__anext__() == "run-1" and sub.connects == 1
        sub.sent.put_nowait("closed")  # open: the socket's end is Prefect's to handle (it connects again)
        with pytest.raises(websockets.exceptions.ConnectionClosedOK):
            await sub.__anext__()
        waiting = asyncio.ensure_future(sub.__anext__())
        await asyncio.sleep(0)
        worker.closed = True
        sub.sent.put_nowait("closed")  # the stop closes the socket under the step that waits
        ended = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 5)
        assert isinstance(ended[0], StopAsyncIteration)
        sub.sent.put_nowait("run-2")
        with pytest.raises(StopAsyncIteration):  # closed: no next step (run-2 was not acknowledged: another worker's)
            await sub.__anext__()
        sub._websocket = None
        with pytest.raises(patches._Closed):  # nor a new connection (Prefect's step connects again after a lost socket)
            await sub._ensure_connected()
        assert sub.connects == 1

    asyncio.run(run())


def test_a_replacement_lasts_its_block_and_leaves_what_was_there():
    class Owner:
        def run(self) -> str:
            return "theirs"

    instance = Owner()
    with patches.started_by(instance, lambda: "ours"):
        assert instance._run_uvicorn_command() == "ours"
    assert not hasattr(instance, "_run_uvicorn_command")  # nothing of its own left on the instance
    import subprocess

    popen = subprocess.Popen
    with patches.starting_our_app(lambda *a, **k: "started"):
        assert subprocess.Popen(["true"]) == "started"
    assert subprocess.Popen is popen


def test_the_log_workers_patch_is_applied_once_and_makes_a_refused_batch_a_warning():
    import asyncio
    import logging

    from prefect.logging.handlers import APILogWorker

    from prefect_hyperband.app.terminal import API_LOGS

    patches.api_log_errors_as_warnings(API_LOGS)
    patched = APILogWorker._handle_batch
    patches.api_log_errors_as_warnings(API_LOGS)
    assert APILogWorker._handle_batch is patched

    async def refused(items):
        raise ConnectionError("gone")

    records: list[logging.LogRecord] = []
    catch = logging.Handler()
    catch.emit = records.append
    logging.getLogger(API_LOGS).addHandler(catch)
    try:
        asyncio.run(APILogWorker._handle_batch(SimpleNamespace(_client=SimpleNamespace(create_logs=refused)), []))
    finally:
        logging.getLogger(API_LOGS).removeHandler(catch)
    assert [r.levelname for r in records] == ["WARNING"]
    assert "the Prefect API did not take the job's log lines (ConnectionError: gone)" in records[0].getMessage()


def test_no_module_but_prefect_internals_replaces_a_librarys_internals_and_none_uses_mock():
    found = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("unittest"):
                    found.append(f"{path.relative_to(ROOT)}: imports {node.module}")
                if isinstance(node, ast.Import) and any(a.name.startswith("unittest") for a in node.names):
                    found.append(f"{path.relative_to(ROOT)}: imports unittest")
            if path.name != "prefect_internals.py" and "method-assign" in text:
                found.append(f"{path.relative_to(ROOT)}: assigns a method")
    assert not found


#: the private Prefect names ``prefect_internals`` reads, calls or replaces: attributes, imported names, modules
PRIVATE_ATTRIBUTES = {"_instances", "server_process", "__var__", "run_results", "drain_all", "_run_uvicorn_command",
                      "_acquire_token", "_release_token", "_subscribe_to_task_scheduling", "_handle_batch",
                      "_ensure_connected", "_websocket", "begin_transaction"}
PRIVATE_IMPORTS = {"QueueService", "SubprocessASGIServer", "emit_task_run_state_change_event", "AioSqliteConfiguration",
                   "Subscription", "APILogWorker"}


def _private_uses(path: Path) -> list[str]:
    """Where ``path`` names one of Prefect's internals (``PRIVATE_*``, ``prefect._internal``, ``prefect.testing``, a
    deferred task run)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prefect"):
            private = [a.name for a in node.names if a.name in PRIVATE_IMPORTS]
            if private or node.module.startswith(("prefect._internal", "prefect.testing")):
                found.append(f"{where}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import) and any(a.name.startswith(("prefect._internal", "prefect.testing"))
                                                  for a in node.names):
            found.append(f"{where}: import {node.names[0].name}")
        elif isinstance(node, ast.Call) and any(k.arg == "deferred" for k in node.keywords):
            found.append(f"{where}: a call with deferred=")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "prefect._internal" in node.value:
            found.append(f"{where}: {node.value!r}")
    return found


def test_no_module_but_prefect_internals_names_a_private_prefect_name():
    """The bound of issue 75: one module holds them all (before: seven modules, about twenty names)."""
    found = [use for folder in PACKAGE for path in sorted((ROOT / folder).rglob("*.py"))
             if path.name != "prefect_internals.py" for use in _private_uses(path)]
    assert not found, found
    assert _private_uses(ROOT / "tasks" / "prefect_internals.py")  # (the scan sees them where they are)


def test_the_internals_read_or_called_are_as_they_were_written_for():
    """What ``temporary_servers``, ``take_up``, ``drain_services``, ``forget_results``, ``detached_task_run`` and the
    logger names rely on, as installed (by what they are and take, not by Prefect's source text)."""
    from prefect._internal.concurrency import logger
    from prefect._internal.concurrency.services import QueueService
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH, load_logging_config
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.tasks import Task
    from prefect.utilities.engine import emit_task_run_state_change_event

    assert isinstance(vars(SubprocessASGIServer)["_instances"], dict)
    assert "timeout" in inspect.signature(QueueService.drain_all).parameters
    assert "run_results" in FlowRunContext.model_fields
    assert type(FlowRunContext.__var__).__name__ == type(TaskRunContext.__var__).__name__ == "ContextVar"
    assert {"parameters", "deferred", "flow_run_context"} <= set(inspect.signature(Task.create_run).parameters)
    assert {"task_run", "initial_state", "validated_state"} <= set(
        inspect.signature(emit_task_run_state_change_event).parameters)
    config = load_logging_config(DEFAULT_LOGGING_SETTINGS_PATH)  # Prefect's own, as its flow runs set it up
    assert config["loggers"][patches.INTERNAL_LOGGER]["propagate"] is False  # not to the root: our handler is its own
    assert logger.name == patches.SERVICES_LOGGER and patches.SERVICES_LOGGER.startswith(patches.INTERNAL_LOGGER)


def test_one_tls_context_per_certificate_file_and_an_unverified_one_made_each_time():
    import ssl

    import certifi
    import prefect.client.orchestration as orchestration

    patches.shared_tls_context()
    patches.shared_tls_context()  # (once)
    made = orchestration.ssl.create_default_context
    assert made(cafile=certifi.where()) is made(cafile=certifi.where())
    assert made(cafile=certifi.where()).verify_mode == ssl.CERT_REQUIRED
    assert made() is not made()  # the insecure path changes the context it gets: its own each time
    assert orchestration.ssl.CERT_NONE == ssl.CERT_NONE and ssl.create_default_context is not made


def test_a_detached_task_run_is_the_callers_flow_runs_and_results_once_forgotten_are_not_kept(prefect_harness):
    """``detached_task_run``: a SCHEDULED task run in the caller's flow run, whose context keeps its runs;
    ``forget_results``: the flow run's links of a result dropped."""
    import contextvars

    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    @task
    def add(x: int) -> list[int]:
        return [x + 1]  # (a small int is shared: Prefect links no result of one)

    @flow
    def caller() -> tuple:
        result = add(1)
        links = FlowRunContext.get().run_results
        kept = id(result) in links
        patches.forget_results(result)
        here = FlowRunContext.get()
        run = contextvars.copy_context().run(patches.detached_task_run, add.with_options(name="later"),
                                             here.model_copy(update={"detached": True}), {"x": 2})
        return kept, id(result) in links, run, FlowRunContext.get() is here, here.flow_run.id

    kept, still, run, unchanged, flow_run_id = caller()
    assert kept and not still and unchanged
    with get_client(sync_client=True) as client:
        stored = client.read_task_run(run.id)
    assert stored.state.type.value == "SCHEDULED" and stored.flow_run_id == flow_run_id
