"""Ports for the servers a test starts, chosen so that a server cannot lose its port to the kernel.

A port from ``bind(("127.0.0.1", 0))`` is an ephemeral one, and between picking it and the server binding it
the kernel may hand the same port to any outgoing connection (a client of the Prefect server the test started
a second earlier): the server then fails with "Address already in use" (seen in CI, a Dask scheduler). Ports
below the kernel's ephemeral range are never given to outgoing connections, so a test picks its ports there,
checks that nothing listens on them, and never hands out one port twice in a process.
"""

from __future__ import annotations

import random
import socket

_given: set[int] = set()


def _ephemeral_low(default: int = 32768) -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing is bound to now, outside the ephemeral range, not given before."""
    high = min(_ephemeral_low(), 65536) - 1
    low = max(1024, high - 12000)
    for _ in range(200):
        port = random.randint(low, high)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{high} on {host}")
