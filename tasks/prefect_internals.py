"""Every private Prefect name this package uses, in one module: the internals it replaces (patches) and those it
reads or calls, each with why no public API serves and the versions it was checked on (``WRITTEN_FOR``: the oldest
and the newest of pyproject.toml's range). ``tests/tasks/test_prefect_internals.py`` has a test per name that fails
when an internal no longer takes what this module passes or does what it relies on (on whatever Prefect the range
installs), and fails when code outside this module names one of them, imports ``prefect._internal`` or
``prefect.testing``, or patches a library.

Replaced (patches):

- ``sqlite_begin_immediate``: Prefect's server, ``AioSqliteConfiguration.begin_transaction``: the two POSTs that read
  and then insert begin IMMEDIATE on SQLite (``flows.server``'s notes: a 503 and a 2 s retry otherwise). No setting.
- ``starting_our_app``: ``subprocess.Popen`` while Prefect's test harness starts its server: our app in place of
  Prefect's (the test suite's and the benchmarks' server, as the CLI's). The harness takes no application.
- ``started_by``: a ``SubprocessASGIServer``'s ``_run_uvicorn_command`` for one ``start()``: it takes up the server
  process the job launched ahead (``flows.process.temporary_server``) instead of starting another.
- ``api_log_errors_as_warnings``: Prefect's log worker, ``APILogWorker._handle_batch`` (and its ``_client``): a
  batch its API did not take is a warning of the job's, not a line glued to the next on stderr (``app.terminal``).
- ``remembering_taken``: Prefect's ``TaskWorker._acquire_token``/``_release_token``, in a subclass: the task runs a
  worker took from the server, begun or still waiting for a slot, known when it stops (``app.worker``: a taken run
  goes to no other worker, so a stopping one hands them back); and its ``_subscribe_to_task_scheduling`` with
  ``prefect.task_worker.Subscription`` a subclass of ours (its ``_ensure_connected``, ``__anext__``, ``_websocket``):
  a stopping worker closes its subscription before it hands back, so that no run reaches it after (one did in the
  milliseconds after the last hand-back, and its job waited Prefect's pickup timeout, 120 s). Prefect's
  ``aserve`` takes no worker class: ``app.worker`` runs its own, with public names only.
- ``shared_tls_context``: the TLS context each Prefect client builds (``prefect.client.orchestration``'s
  ``ssl.create_default_context(cafile=...)``, 13 ms of CPU here: certifi's bundle parsed again), made once per
  certificate file and shared: Prefect makes a client per task run (a task worker's, the job's).

Read or called:

- ``temporary_servers``, ``process_of``, ``take_up``: ``SubprocessASGIServer._instances`` (the temporary servers
  a process started, to stop them at its exit) and the ``port``/``server_process`` of one (a server launched
  ahead, taken up by a retry). Prefect has no public handle on a temporary server it started for the process.
- ``drain_services``: ``QueueService.drain_all`` (``prefect._internal.concurrency.services``): the log and event
  workers flushed before a forced exit (``os._exit``: a hung user training); Prefect drains them only at exit.
- ``forget_results``: ``FlowRunContext.run_results``: a finished trial-rung's results dropped from the flow run's
  links (it kept every one: the job's memory grew by every trial-rung); no API forgets them.
- ``detached_task_run``: ``FlowRunContext.__var__``/``TaskRunContext.__var__`` set to None, ``Task.create_run(
  deferred=True, flow_run_context=...)`` and ``emit_task_run_state_change_event``: ``Task.apply_async``'s steps with
  the task run in the caller's flow run (the UI shows it there) and no run in the context Prefect pickles with the
  parameters; ``apply_async`` takes no flow run.
- ``INTERNAL_LOGGER``, ``SERVICES_LOGGER``: the names of Prefect's internal loggers (``prefect._internal``, which does
  not propagate; its services' failures): the terminal's filter goes on their handlers (``app.terminal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import subprocess
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import websockets.exceptions

#: the versions these patches were written and tested for (the suite passed on each: the oldest the package declares
#: and the newest released); a record for whoever reads this module again, not a pin
WRITTEN_FOR = {"prefect": ("3.8.8", "3.9.1")}

_MISSING = object()
#: Prefect's internal logger (it does not propagate to the root) and its services' (the log and event workers)
INTERNAL_LOGGER = "prefect._internal"
SERVICES_LOGGER = "prefect._internal.concurrency"


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block, and what it was (or nothing of its own) after it."""
    old = vars(owner).get(name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


def sqlite_begin_immediate(when: Callable[[], bool]) -> None:
    """In a Prefect server's process: its SQLite transactions begin IMMEDIATE (the write lock first) while
    ``when()`` is true, as Prefect's own orchestration asks with ``with_for_update``."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    begin = AioSqliteConfiguration.begin_transaction
    if getattr(begin, "hyperband", False):
        return

    def begin_transaction(self: Any, session: Any, with_for_update: bool = False) -> Any:
        return begin(self, session, with_for_update=with_for_update or when())

    begin_transaction.hyperband = True  # type: ignore[attr-defined]
    AioSqliteConfiguration.begin_transaction = begin_transaction  # type: ignore[method-assign]


def starting_our_app(popen: Callable[..., Any]) -> contextlib.AbstractContextManager[None]:
    """Inside the block, ``subprocess.Popen`` is ``popen`` (``flows.server.with_our_app``): Prefect's test harness
    starts its server through it, with no parameter for the application."""
    return _replaced(subprocess, "Popen", popen)


def started_by(instance: Any, run_uvicorn: Callable[[], Any]) -> contextlib.AbstractContextManager[None]:
    """Inside the block, ``instance`` (Prefect's ``SubprocessASGIServer``) starts its process with ``run_uvicorn()``
    instead of its ``_run_uvicorn_command``, its own start's health wait and bookkeeping unchanged."""
    return _replaced(instance, "_run_uvicorn_command", run_uvicorn)


def api_log_errors_as_warnings(logger: str) -> None:
    """Prefect's log worker writes ``--- Error logging to API ---`` and the error, with no newline, straight to stderr
    for every batch its API did not take (its server restarting). The same call with the error as a warning of
    ``logger`` instead (its traceback at Prefect's internal DEBUG level, as Prefect's)."""
    from prefect.logging.handlers import APILogWorker

    if getattr(APILogWorker._handle_batch, "hyperband", False):
        return

    async def _handle_batch(self: Any, items: Any) -> None:
        try:
            if items and isinstance(items[0], (bytes, bytearray)):  # 3.9: each line serialized as it was queued
                await self._client.request("POST", "/logs/", content=b"[" + b",".join(items) + b"]",
                                           headers={"Content-Type": "application/json"})
            else:  # 3.8: the lines as dicts
                await self._client.create_logs(items)
        except Exception as exc:  # noqa: BLE001  (as Prefect's: a log line is never the job's failure)
            from prefect.settings import PREFECT_LOGGING_INTERNAL_LEVEL

            logging.getLogger(logger).warning(
                "the Prefect API did not take the job's log lines (%s: %s); the Prefect UI misses those of that "
                "moment (the terminal and job.log keep them)", type(exc).__name__, exc,
                exc_info=PREFECT_LOGGING_INTERNAL_LEVEL.value() == "DEBUG")

    _handle_batch.hyperband = True  # type: ignore[attr-defined]
    APILogWorker._handle_batch = _handle_batch  # type: ignore[method-assign]


def remembering_taken(task_worker: type) -> type:
    """A subclass of Prefect's ``TaskWorker`` whose ``taken`` holds the ids of the task runs it took from the server
    and has not finished: its ``_acquire_token`` (called as a run arrives, before it waits for a free slot) and
    ``_release_token`` (called as it ends) note them. Once ``closed`` (the worker stopping), a run that arrives, or
    that was waiting for a slot, is noted and not begun (``_acquire_token`` False: Prefect's loop then leaves it), for
    the worker to hand back; ``begun`` holds those that did begin until Prefect's engine has ended them. A subclass's
    ``note_taken`` hears of each run as it arrives."""

    class Remembering(task_worker):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.taken: set[Any] = set()
            self.begun: set[Any] = set()  # those of ``taken`` given a slot, until Prefect's engine has ended them
            self.closed = False
            self.subscription: Any = None  # (its Subscription, on its event loop ``loop``)
            self.loop: Any = None
            self.ended = threading.Event()  # its subscription is over: no run arrives any more

        async def _subscribe_to_task_scheduling(self) -> None:
            import prefect.task_worker

            self.loop = asyncio.get_running_loop()
            try:
                with _replaced(prefect.task_worker, "Subscription", _ending(prefect.task_worker.Subscription, self)):
                    await super()._subscribe_to_task_scheduling()
            finally:
                self.ended.set()
            if self.closed:  # ended by the stop: the worker stays as it was (its runs end, its slots, its engine)
                await asyncio.Event().wait()  # until its process ends: no teardown under what it hands back

        def close_subscription(self, timeout: float) -> bool:
            """Closed, its subscription's socket too (from another thread): a run sent and not acknowledged goes back to
            the server's queue; one acknowledged is in ``taken``. True once no run can arrive (within ``timeout``)."""
            return _close(self, timeout)

        #: ``async (task_run_id) -> None``, awaited as a run arrives, before it waits for a slot (``app.worker``'s claim)
        note_taken: Any = None

        async def _acquire_token(self, task_run_id: Any) -> bool:
            self.taken.add(task_run_id)
            if self.note_taken is not None and not self.closed:
                await self.note_taken(task_run_id)
            if self.closed:
                return False
            got = await super()._acquire_token(task_run_id)
            if got and self.closed:  # it waited for a slot while the worker stopped: not begun, handed back
                super()._release_token(task_run_id)
                return False
            if got:
                self.begun.add(task_run_id)
            return got

        def _release_token(self, task_run_id: Any) -> bool:
            self.taken.discard(task_run_id)
            self.begun.discard(task_run_id)  # (after Prefect's engine ended it: its last lines and events are out)
            return super()._release_token(task_run_id)

    return Remembering


def _close(worker: Any, timeout: float) -> bool:
    """``remembering_taken``'s ``close_subscription``."""
    worker.closed = True
    socket = getattr(worker.subscription, "_websocket", None)
    if socket is not None and worker.loop is not None and not worker.loop.is_closed():
        asyncio.run_coroutine_threadsafe(socket.close(), worker.loop)
    return worker.ended.wait(timeout)


class _Closed(Exception):
    """A closed worker's subscription does not connect again."""


def _ending(subscription: type, worker: Any) -> type:
    """Prefect's ``Subscription`` (``prefect.client.subscriptions``), kept on ``worker`` and ended once it is closed:
    its socket closed under it, or a reconnection it would make, ends the iteration."""
    class Ending(subscription):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            worker.subscription = self

        async def _ensure_connected(self) -> None:
            if worker.closed and self._websocket is None:
                raise _Closed
            await super()._ensure_connected()

        async def __anext__(self) -> Any:
            if worker.closed:
                raise StopAsyncIteration
            try:
                return await super().__anext__()
            except (_Closed, websockets.exceptions.ConnectionClosed):
                if worker.closed:
                    raise StopAsyncIteration from None
                raise

    return Ending


def shared_tls_context() -> None:
    """Prefect's clients build their TLS context with ``ssl.create_default_context(cafile=...)`` each (certifi's bundle
    parsed: 13 ms of CPU, a task worker's largest cost per task run after the training); the same verified context,
    made once per certificate file, for all of them. An unverified one (``PREFECT_API_TLS_INSECURE_SKIP_VERIFY``,
    changed after it is made) is still made each time."""
    import prefect.client.orchestration as orchestration

    if getattr(orchestration.ssl, "hyperband", False):
        return
    made = functools.lru_cache(maxsize=8)(ssl.create_default_context)

    def create_default_context(purpose: Any = ssl.Purpose.SERVER_AUTH, *, cafile: Any = None, **kwargs: Any) -> Any:
        if cafile is not None and not kwargs and purpose == ssl.Purpose.SERVER_AUTH:
            return made(cafile=cafile)
        return ssl.create_default_context(purpose, cafile=cafile, **kwargs)

    shim = types.SimpleNamespace(**{k: getattr(ssl, k) for k in dir(ssl) if not k.startswith("__")})
    shim.create_default_context, shim.hyperband = create_default_context, True
    orchestration.ssl = shim  # type: ignore[assignment]


def temporary_servers() -> list[Any]:
    """Prefect's temporary servers (``SubprocessASGIServer``) this process started."""
    from prefect.server.api.server import SubprocessASGIServer

    return list(SubprocessASGIServer._instances.values())


def process_of(instance: Any) -> Any:
    """The process of a temporary server (None before its start)."""
    return instance.server_process


def take_up(instance: Any, port: int, process: Any = _MISSING) -> None:
    """``instance`` (a ``SubprocessASGIServer``) on ``port``, and its process ``process`` where given."""
    instance.port = port
    if process is not _MISSING:
        instance.server_process = process


def drain_services(timeout: float) -> None:
    """Prefect's log and event workers' queues sent to the API (up to ``timeout`` seconds): before a forced exit."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=timeout)


def forget_results(*results: object) -> None:
    """Each result (and its fields, one level: Prefect links those too) dropped from the flow run's links of results
    to the task runs that made them (``FlowRunContext.run_results``): none is passed on to another task again."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None:
        return
    for result in results:
        context.run_results.pop(id(result), None)
        for value in getattr(result, "__dict__", {}).values():
            context.run_results.pop(id(value), None)


def detached_task_run(submitted: Any, flow_run: Any, parameters: dict[str, Any]) -> Any:
    """``submitted.delay(**parameters)``'s task run (``Task.apply_async``'s steps), in ``flow_run`` (a detached copy
    of the caller's flow run context, or None), with no run in the context Prefect stores with the parameters. Called
    in a copy of the caller's context: the runs it clears there stay in the caller's."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.utilities.asyncutils import run_coro_as_sync
    from prefect.utilities.engine import emit_task_run_state_change_event

    FlowRunContext.__var__.set(None)
    TaskRunContext.__var__.set(None)
    run = run_coro_as_sync(submitted.create_run(parameters=parameters, deferred=True, flow_run_context=flow_run))
    emit_task_run_state_change_event(task_run=run, initial_state=None, validated_state=run.state)
    return run
