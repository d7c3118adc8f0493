"""The warm pool's files: the trainer writes ``request-<n>.json`` (``executors.torch_pool``), rank 0 reads it
(``trainers.torch.worker.serve``): one name for both sides, and rank 0's polling."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def read_job(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


#: Rank 0 polls for the next request this often (seconds): the dispatch latency of a warm call.
#: After IDLE_BACKOFF seconds without a request it polls every IDLE_POLL_SECONDS instead, so an idle
#: pool does not take CPU from the trials and the orchestrator it shares the machine with.
POLL_SECONDS = 0.002
IDLE_POLL_SECONDS = 0.02
IDLE_BACKOFF = 0.2
#: An idle rank 0 broadcasts a no-op this often, far inside the collectives' timeout.
HEARTBEAT_SECONDS = 60.0


def request_path(pool_dir: Path, seq: int) -> Path:
    return pool_dir / f"request-{seq}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def next_request(pool_dir: Path, seq: int, owner: int, stop_at: float) -> dict[str, Any]:
    """Rank 0: the next job; a ``ping`` when idle for a while; ``stop`` when the owner or the
    folder is gone or the pool has been idle past ``stop_at`` (time.monotonic())."""
    path = request_path(pool_dir, seq)
    began = checked = time.monotonic()
    while True:
        if path.is_file():
            job = read_job(str(path))
            path.unlink(missing_ok=True)
            return job
        now = time.monotonic()
        if now - checked >= 1.0:
            checked = now
            if not pool_dir.is_dir() or (owner > 0 and not _alive(owner)) or now >= stop_at:
                return {"op": "stop"}
        if now - began >= HEARTBEAT_SECONDS:
            return {"op": "ping"}
        time.sleep(POLL_SECONDS if now - began < IDLE_BACKOFF else IDLE_POLL_SECONDS)
