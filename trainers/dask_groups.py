"""Disjoint groups of ``n`` Dask workers, each running one trial-rung at a time: the rule the XGBoost and the torch
trainers share on a cluster.

The cluster's W workers make W // n groups (the rest wait unused). A group is packed on as few hosts as the
workers allow (workers sorted by host, then port), since ranks on one host talk through its memory. A trial-rung
takes a free group and gives it back: two trial-rungs never share a worker, so two collectives never interleave
on one worker (they would deadlock on single-threaded workers).
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any, Callable, Iterator

from prefect_hyperband.trainers.errors import InputError


def connect(address: str, workers: int):
    """A ``distributed.Client`` of the scheduler at ``address`` with at least ``workers`` workers (else one line)."""
    from distributed import Client

    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise InputError(f"cannot reach the Dask scheduler at {address}: {exc}") from exc
    available = len(client.scheduler_info()["workers"])
    if available < workers:
        client.close()
        raise InputError(f"the Dask cluster at {address} has {available} workers, fewer than --workers {workers}")
    return client


def cluster_size(address: str, workers: int) -> int:
    """Workers of the cluster at ``address`` (one short connection; ``connect``'s checks): a job's preflight."""
    client = connect(address, workers)
    try:
        return len(client.scheduler_info()["workers"])
    finally:
        client.close()


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
    """The free groups of a client's cluster; ``prepare(group)`` is what each group keeps (its data, say)."""

    def __init__(self, client: Any, n: int, prepare: Callable[[tuple[str, ...]], Any] = lambda group: None) -> None:
        self.groups = split(list(client.scheduler_info()["workers"]), n)
        self._free: queue.Queue | None = queue.Queue()
        for group in self.groups:
            self._free.put((group, prepare(group)))

    @contextlib.contextmanager
    def take(self) -> Iterator[tuple[tuple[str, ...], Any]]:
        """A free group and what it keeps, for one trial-rung (waits while every group is busy)."""
        free = self._free
        if free is None:
            raise RuntimeError("the Dask cluster of this trainer is closed (the job is stopping)")
        item = free.get()
        try:
            yield item
        finally:
            free.put(item)

    def close(self) -> None:
        self._free = None
