"""``flows/patches.py`` holds every patch of a library's internals: each for the version it names, each internal it
replaces as it was when written, and no patch elsewhere in the package."""

from __future__ import annotations

import ast
import inspect
import re
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest

from prefect_hyperband.flows import patches

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("app", "flows", "tasks", "executors", "trainers", "hyperband", "deployments", "examples", "common")


def test_the_installed_libraries_are_the_versions_the_patches_were_written_for():
    """The installed version is one the patches were checked on, and those are the ends of the declared range."""
    ranges = {name: low for name, low, _ in re.findall(r'"([a-z-]+)>=([\d.]+),<(\d+)"',
                                                         (ROOT / "pyproject.toml").read_text())}
    for library, written_for in patches.WRITTEN_FOR.items():
        assert version(library) in written_for, f"re-read flows/patches.py for {library} {version(library)}"
        assert ranges[library] == written_for[0], f"{library}: the range's lowest is {ranges[library]}"


def test_the_internals_the_patches_replace_are_as_they_were_written_for():
    import prefect.logging.handlers as handlers
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.configurations import AioSqliteConfiguration

    # the source as installed: this process may have patched the class already
    source = Path(handlers.__file__).read_text()
    assert "--- Error logging to API ---" in source
    assert ("async def _handle_batch(self, items: list[dict[str, Any]]):" in source  # 3.8
            and "await self._client.create_logs(items)" in source) or (
        "async def _handle_batch(self, items: list[bytes]):" in source  # 3.9: lines queued as JSON bytes
        and 'content=b"[" + b",".join(items) + b"]",' in source)
    assert list(inspect.signature(SubprocessASGIServer._run_uvicorn_command).parameters) == ["self"]
    assert "self.server_process = self._run_uvicorn_command()" in inspect.getsource(SubprocessASGIServer.start)
    assert list(inspect.signature(AioSqliteConfiguration.begin_transaction).parameters) == [
        "self", "session", "with_for_update"]
    from prefect.task_worker import TaskWorker

    # a run is taken (its token asked for) as it arrives, before it waits for a slot; released as it ends
    assert list(inspect.signature(TaskWorker._acquire_token).parameters) == ["self", "task_run_id"]
    assert list(inspect.signature(TaskWorker._release_token).parameters) == ["self", "task_run_id"]
    arrives = inspect.getsource(TaskWorker._subscribe_to_task_scheduling)
    assert arrives.index("await self._acquire_token(task_run.id)") < arrives.index("start_soon(")
    assert "if token_acquired:" in arrives  # a run without a token is not begun (a closed worker's)
    assert "self._release_token(task_run.id)" in inspect.getsource(TaskWorker._safe_submit_scheduled_task_run)
    # the subscription: made from the module's name, connected at each step, its socket closed under it ends the step
    from prefect.client.subscriptions import Subscription

    assert "async for task_run in Subscription(" in arrives
    step = inspect.getsource(Subscription.__anext__)
    assert "await self._ensure_connected()" in step and "message = await self.websocket.recv()" in step
    assert "websockets.exceptions.ConnectionClosedError," in step and "ConnectionClosedOK" not in step
    assert "self._websocket = None" in inspect.getsource(Subscription.__init__)


def test_a_remembering_task_worker_knows_what_it_took_until_it_ends():
    import asyncio

    from prefect.task_worker import TaskWorker

    from prefect_hyperband.executors import task_workers

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


def test_no_module_but_patches_replaces_a_librarys_internals_and_none_uses_mock():
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
            if path.name != "patches.py" and "method-assign" in text:
                found.append(f"{path.relative_to(ROOT)}: assigns a method")
    assert not found
