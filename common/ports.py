"""A free port on this host."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port free on this host (for a rendezvous: a one-rank script here, a group's first Dask worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
